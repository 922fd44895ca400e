#!/usr/bin/env bash
# Call 6 (1 GPU): build; the LLaMA fused-op GPU tests; A/B of the RMSNorm backward kernel keeping rows in
# registers (this tree) against commit cb41cb4's fused_kernels.cu, alternating binaries, two rounds bf16.
set -u
: "${OUT:?}"
CTEST_ARGS="-R LlamaFusedOps" timeout 300 bash cmake/scripts/gpu_check.sh "$OUT" ctest_gpu > "$OUT/gpu_check.log" 2>&1
echo "gpu_check rc=$?" >> "$OUT/gpu_check.log"
tail -n 1 "$OUT/gpu_check.log"; grep -E "tests passed|\*\*\*Failed" "$OUT/ctest_gpu.log" | head -5
B=build/gpu
cp $B/benchmarks/scaling/scaling_bench /tmp/bench_new
cp .dbg/old/fused_kernels.cu examples/llama/
timeout 120 cmake --build $B --target scaling_bench > "$OUT/build-old.log" 2>&1 && cp $B/benchmarks/scaling/scaling_bench /tmp/bench_old
run="$B/libddp/ddprun --nproc-per-node 1 --standalone"
for round in 1 2; do
  for v in new old; do
    timeout 40 $run /tmp/bench_$v --model llama --steps 12 --warmup 5 --precision bf16 --json $OUT/ab-normbwd-$v.jsonl >> "$OUT/ab.log" 2>&1
    echo "$v rc=$?" >> "$OUT/ab.log"
  done
done
python3 - "$OUT" <<'PY'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/ab-normbwd*.jsonl")):
    for l in open(f):
        r = json.loads(l)
        print(f.split("/")[-1], r["throughput"], r.get("forward_ms"), r.get("backward_ms"))
PY
grep "rc=" "$OUT/ab.log" | tr '\n' ' '
