#!/usr/bin/env bash
# Call 5 (1 GPU): build; the LLaMA, Float8Linear and sharding GPU tests; the A/B of the block-end residual add
# fused into the next block's norm (this tree) against the add in the block (commit 19fed11's llama_model.*),
# alternating binaries, three rounds bf16, one fp8; one profiled step.
set -u
: "${OUT:?}"
CTEST_ARGS="-R (Llama|Float8|Sharding|Captured)" timeout 400 bash cmake/scripts/gpu_check.sh "$OUT" ctest_gpu > "$OUT/gpu_check.log" 2>&1
echo "gpu_check rc=$?" >> "$OUT/gpu_check.log"
B=build/gpu
cp $B/benchmarks/scaling/scaling_bench /tmp/bench_new
mkdir -p /tmp/keep && cp examples/llama/llama_model.h examples/llama/llama_model.cpp /tmp/keep/
cp .dbg/old/llama_model.h .dbg/old/llama_model.cpp examples/llama/
cmake --build $B --target scaling_bench > "$OUT/build-old.log" 2>&1 && cp $B/benchmarks/scaling/scaling_bench /tmp/bench_old
cp /tmp/keep/llama_model.h /tmp/keep/llama_model.cpp examples/llama/
cmake --build $B --target scaling_bench >> "$OUT/build-old.log" 2>&1
run="$B/libddp/ddprun --nproc-per-node 1 --standalone"
args="--model llama --steps 15 --warmup 6"
for round in 1 2 3; do
  for v in new old; do
    timeout 60 $run /tmp/bench_$v $args --precision bf16 --json $OUT/ab-crossblock-$v.jsonl >> "$OUT/ab.log" 2>&1; echo "$v rc=$?" >> "$OUT/ab.log"
  done
done
for v in new old; do
  timeout 60 $run /tmp/bench_$v $args --precision fp8 --fp8-fast-accum --json $OUT/ab-crossblock-fp8-$v.jsonl >> "$OUT/ab.log" 2>&1
done
timeout 60 $run /tmp/bench_new $args --precision bf16 --steps 3 --warmup 4 --profile-trace "$OUT/trace-crossblock.json" > "$OUT/trace.log" 2>&1
gzip -f "$OUT"/trace-*.json
tar czf "$OUT/all.tgz" -C "$OUT" --exclude all.tgz .
tail -n 2 "$OUT/gpu_check.log"; grep -E "tests passed|Total Test" "$OUT/ctest_gpu.log"; grep -E "\*\*\*Failed|\*\*\*Timeout" "$OUT/ctest_gpu.log" | head
grep -E "decoder:" "$OUT/ctest_gpu.log" | head -2
python3 - "$OUT" <<'PY'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/ab-crossblock*.jsonl")):
    for l in open(f):
        r = json.loads(l)
        print(f.split("/")[-1], r["throughput"], r.get("forward_ms"), r.get("backward_ms"), r.get("peak_mem_gib"))
PY
grep "rc=" "$OUT/ab.log" | tr '\n' ' '
