#!/usr/bin/env bash
# Session 12 call 2 (2 GPUs): build, the copy-engine and NCCL tests, then the A/B of copy-engine reductions on
# LLaMA-1.1B bf16 (alternating). Usage: OUT=... bash .dbg/s12call2.sh [ROUNDS]
set -u
: "${OUT:?}"
rounds=${1:-1}
CTEST_ARGS="-R (CopyEngine|NcclCollectives|NcclFailures|DdpNccl.MlpAndConv)" timeout 330 \
  bash cmake/scripts/gpu_check.sh "$OUT" ctest_gpu > "$OUT/gpu_check.log" 2>&1
echo "gpu_check rc=$?" >> "$OUT/gpu_check.log"
B=build/gpu
run="$B/libddp/ddprun --nproc-per-node 2 --standalone $B/benchmarks/scaling/scaling_bench --model llama --precision bf16 --steps 12 --warmup 4 --json $OUT/ab-ce.jsonl"
for round in $(seq "$rounds"); do
  timeout 90 $run >> "$OUT/ab.log" 2>&1; echo "nccl rc=$?" >> "$OUT/ab.log"
  timeout 90 $run --copy-engine-reductions >> "$OUT/ab.log" 2>&1; echo "copy-engine rc=$?" >> "$OUT/ab.log"
done
tar czf "$OUT/all.tgz" -C "$OUT" --exclude all.tgz . 2>/dev/null
grep -E "tests passed|\*\*\*Failed|\*\*\*Timeout|Total Test|\(Failed\)" "$OUT/ctest_gpu.log" | head -20
grep -B2 -A12 "Failure\|what():\|rank [01]: " "$OUT/ctest_gpu.log" | grep -v "^\[ *OK\|RUN" | head -60
python3 - "$OUT" <<'PY'
import json, sys, os
p = sys.argv[1] + "/ab-ce.jsonl"
if os.path.exists(p):
    for r in map(json.loads, open(p)):
        print(r.get("copy_engine_reductions"), r["throughput"], r["backward_ms"], r["exposed_comm_ms"], r["peak_mem_gib"], r["final_loss"])
PY
grep -iE "error|rc=" "$OUT/ab.log" | head -10
