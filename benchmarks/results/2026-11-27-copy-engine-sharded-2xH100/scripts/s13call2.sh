#!/usr/bin/env bash
# Session 13 call 2 (2 GPUs): build; the copy-engine tests again (NCCL warmed before the stall, bytes gathered);
# LLaMA-1.1B bf16 eager: plain DDP and the sharded modes, NCCL vs copy engines, one machine; 1 GPU reference.
set -u
: "${OUT:?}"
CTEST_ARGS="-R (CopyEngine|DdpNccl.Sharded)" timeout 300 bash cmake/scripts/gpu_check.sh "$OUT" ctest_gpu > "$OUT/gpu_check.log" 2>&1
echo "gpu_check rc=$?"
grep -E "Test +#|tests passed" "$OUT/ctest_gpu.log" | grep -E "Passed|Failed|tests passed|Timeout"
B=build/gpu
bench="$B/benchmarks/scaling/scaling_bench --model llama --precision bf16 --steps 12 --warmup 4 --json $OUT/ab.jsonl"
two="$B/libddp/ddprun --nproc-per-node 2 --standalone $bench"
timeout 45 $B/libddp/ddprun --nproc-per-node 1 --standalone $bench >> "$OUT/ab.log" 2>&1; echo "1gpu rc=$?"
for mode in none gradients full; do
  for v in "" "--copy-engine-reductions"; do
    [[ $SECONDS -gt 560 ]] && break 2
    timeout 45 $two --sharding $mode $v >> "$OUT/ab.log" 2>&1; echo "$mode $v rc=$?"
  done
done
tar czf "$OUT/all.tgz" -C "$OUT" --exclude all.tgz . 2>/dev/null
python3 - "$OUT" <<'PY'
import json, sys, os
p = sys.argv[1] + "/ab.jsonl"
if os.path.exists(p):
    for r in map(json.loads, open(p)):
        print(r["gpus"], r["sharding"], "ce" if r.get("copy_engine_reductions") else "nccl", r["throughput"], r["step_ms"], r.get("backward_ms"), r.get("exposed_comm_ms"), r.get("peak_memory_gib", r.get("peak_gib")), r["final_loss"])
PY
grep -iE "error" "$OUT/ab.log" | head -10
echo "elapsed $SECONDS"
