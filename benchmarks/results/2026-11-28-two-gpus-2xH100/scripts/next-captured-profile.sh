#!/usr/bin/env bash
# For the next session with device time (one GPU; written in session 21, not yet run): scaling_bench --profile-trace of a captured step's replay (new). LLaMA fp8 captured,
# plain against ZeRO-2 with bf16 units at world size 1: the kernels of the 4 ms the sharded configuration costs.
set -u
: "${OUT:?}"
B=build/gpu
{ bash cmake/scripts/configure.sh python $B -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 &&
  cmake --build $B -j "$(nproc)" --target scaling_bench ddprun; } > "$OUT/build.log" 2>&1; echo "build rc=$? at $SECONDS s"
run="$B/libddp/ddprun --nproc-per-node 1 --standalone $B/benchmarks/scaling/scaling_bench --model llama --precision fp8 --fp8-fast-accum --warmup 4 --steps 6 --cuda-graph"
timeout 50 $run --json "$OUT/rows.jsonl" --profile-trace /tmp/plain.json > /tmp/a.log 2>&1; echo "plain rc=$? at $SECONDS s"; tail -c 400 /tmp/a.log | grep -i error
timeout 50 $run --sharding gradients --param-dtype bf16 --copy-engine-reductions --json "$OUT/rows.jsonl" --profile-trace /tmp/zero2.json > /tmp/b.log 2>&1; echo "zero2 rc=$? at $SECONDS s"
python3 benchmarks/scaling/kernel_diff.py --labels plain,zero2 --top 16 --width 110 --gaps 3 /tmp/plain.json /tmp/zero2.json > "$OUT/diff-captured-fp8-plain-zero2.txt" 2>&1
head -c 5000 "$OUT/diff-captured-fp8-plain-zero2.txt"
python3 -c "
import json,sys
for r in map(json.loads, open('$OUT/rows.jsonl')): print(r.get('sharding'), round(r['throughput']), r['step_ms'])"
