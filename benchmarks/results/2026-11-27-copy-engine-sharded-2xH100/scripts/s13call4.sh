#!/usr/bin/env bash
# Session 13 call 4 (2 GPUs): LLaMA-1.1B bf16 captured, ZeRO-2 on the copy engines: bf16 reduction, 50 and 100 MB buckets.
set -u
: "${OUT:?}"
timeout 200 bash cmake/scripts/gpu_check.sh "$OUT" none > "$OUT/gpu_check.log" 2>&1
echo "build rc=$? at $SECONDS s"
B=build/gpu
bench="$B/benchmarks/scaling/scaling_bench --model llama --precision bf16 --steps 12 --warmup 4 --json $OUT/ab.jsonl"
two="$B/libddp/ddprun --nproc-per-node 2 --standalone $bench --cuda-graph --sharding gradients --copy-engine-reductions"
for run in "--reduce-dtype bf16" "--bucket-cap-mb 100" "" "--bucket-cap-mb 50"; do
  [[ $SECONDS -gt 330 ]] && break
  timeout 45 $two $run >> "$OUT/ab.log" 2>&1; echo "$run rc=$?"
done
python3 - "$OUT" <<'PY'
import json, sys, os
p = sys.argv[1] + "/ab.jsonl"
if os.path.exists(p):
    for r in map(json.loads, open(p)):
        print(r["impl"], r["gpus"], r.get("sharding"), r.get("reduce_dtype"), r.get("bucket_cap_mb"), r["throughput"], r["step_ms"], r.get("final_loss"))
PY
grep -iE "error" "$OUT/ab.log" | head -5
echo "elapsed $SECONDS"
