#!/usr/bin/env bash
# Session 13 call 3 (2 GPUs): build; the stalled-peer test; LLaMA-1.1B bf16 captured: 1 GPU, 2 GPUs plain/ZeRO-2/ZeRO-3
# on the copy engines and ZeRO-2 on NCCL; PyTorch eager DDP 1 and 2 GPUs on the same machine.
set -u
: "${OUT:?}"
CTEST_ARGS="-R (AStalledPeer|NcclFailures)" timeout 260 bash cmake/scripts/gpu_check.sh "$OUT" ctest_gpu > "$OUT/gpu_check.log" 2>&1
echo "gpu_check rc=$? at $SECONDS s"
grep -E "Test +#|tests passed" "$OUT/ctest_gpu.log" | grep -E "Passed|Failed|tests passed|Timeout"
B=build/gpu
bench="$B/benchmarks/scaling/scaling_bench --model llama --precision bf16 --steps 12 --warmup 4 --json $OUT/ab.jsonl"
two="$B/libddp/ddprun --nproc-per-node 2 --standalone $bench --cuda-graph"
timeout 45 $B/libddp/ddprun --nproc-per-node 1 --standalone $bench --cuda-graph >> "$OUT/ab.log" 2>&1; echo "1gpu rc=$?"
for run in "none --copy-engine-reductions" "gradients --copy-engine-reductions" "gradients" "full --copy-engine-reductions"; do
  [[ $SECONDS -gt 420 ]] && break
  timeout 45 $two --sharding $run >> "$OUT/ab.log" 2>&1; echo "$run rc=$?"
done
for g in 1 2; do
  [[ $SECONDS -gt 500 ]] && break
  timeout 75 python3 -m torch.distributed.run --standalone --nproc-per-node $g benchmarks/scaling/pytorch_ddp.py \
    --model llama --preset tinyllama-1.1b --seq 2048 --batch 4 --precision bf16 --steps 12 --warmup 4 --json "$OUT/ab.jsonl" > "$OUT/pt-$g.log" 2>&1
  echo "pytorch $g rc=$?"
done
tar czf "$OUT/all.tgz" -C "$OUT" --exclude all.tgz . 2>/dev/null
python3 - "$OUT" <<'PY'
import json, sys, os
p = sys.argv[1] + "/ab.jsonl"
if os.path.exists(p):
    for r in map(json.loads, open(p)):
        print(r["impl"], r["gpus"], r.get("sharding"), "ce" if r.get("copy_engine_reductions") else "nccl", r.get("cuda_graph"), r["throughput"], r["step_ms"], r.get("backward_ms"), r.get("exposed_comm_ms"), r.get("final_loss"))
PY
grep -iE "error" "$OUT/ab.log" | head -10
echo "elapsed $SECONDS"
