#!/usr/bin/env bash
# Session 12 call 5 (2 GPUs): build; the copy-engine tests (self-lowering flags, now also inside captured steps);
# LLaMA-1.1B bf16 and ResNet-50 bf16, NCCL vs copy engines, eager and captured, 1 GPU as the reference.
set -u
: "${OUT:?}"
CTEST_ARGS="-R (CopyEngine|NcclFailures.Watchdog|CapturedStepWithBucketReductions)" timeout 330 \
  bash cmake/scripts/gpu_check.sh "$OUT" ctest_gpu > "$OUT/gpu_check.log" 2>&1
echo "gpu_check rc=$?" >> "$OUT/gpu_check.log"
B=build/gpu
bench="$B/benchmarks/scaling/scaling_bench --steps 12 --warmup 4 --json $OUT/ab.jsonl"
two="$B/libddp/ddprun --nproc-per-node 2 --standalone $bench"
timeout 50 $B/libddp/ddprun --nproc-per-node 1 --standalone $bench --model llama --precision bf16 --cuda-graph >> "$OUT/ab.log" 2>&1
for v in "" "--copy-engine-reductions"; do
  timeout 50 $two --model llama --precision bf16 --cuda-graph $v >> "$OUT/ab.log" 2>&1; echo "llama graph $v rc=$?" >> "$OUT/ab.log"
done
for v in "" "--copy-engine-reductions"; do
  timeout 50 $two --model llama --precision bf16 $v >> "$OUT/ab.log" 2>&1; echo "llama $v rc=$?" >> "$OUT/ab.log"
done
timeout 50 $B/libddp/ddprun --nproc-per-node 1 --standalone $bench --model resnet50 --precision bf16 --cuda-graph >> "$OUT/ab.log" 2>&1
for v in "" "--copy-engine-reductions"; do
  timeout 50 $two --model resnet50 --precision bf16 --cuda-graph $v >> "$OUT/ab.log" 2>&1; echo "resnet graph $v rc=$?" >> "$OUT/ab.log"
done
tar czf "$OUT/all.tgz" -C "$OUT" --exclude all.tgz . 2>/dev/null
grep -E "Test #|tests passed" "$OUT/ctest_gpu.log" | grep -E "Passed|Failed|tests passed|Timeout" | head -20
grep -B3 -A10 "what()\|Failure\|error:" "$OUT/ctest_gpu.log" | head -40
python3 - "$OUT" <<'PY'
import json, sys, os
p = sys.argv[1] + "/ab.jsonl"
if os.path.exists(p):
    for r in map(json.loads, open(p)):
        print(r["model"] if "model" in r else "", r["impl"], r["gpus"], "ce" if r.get("copy_engine_reductions") else "nccl", r["throughput"], r["step_ms"], r["backward_ms"], r["exposed_comm_ms"], r["final_loss"])
PY
grep -iE "error|rc=[1-9]" "$OUT/ab.log" | head -10
