#!/usr/bin/env bash
# Session 21 call 5 (one H100, main 77eb8b2): the fixed cost of ZeRO-2 with bf16 units on one GPU. Eager fp8 steps
# profiled plain and ZeRO-2 (kernels that differ); captured bf16 plain against ZeRO-2.
set -u
: "${OUT:?}"
nvidia-smi -L
B=build/gpu
{ bash cmake/scripts/configure.sh python $B -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 &&
  cmake --build $B -j "$(nproc)" --target scaling_bench ddprun; } > "$OUT/build.log" 2>&1; echo "build rc=$? at $SECONDS s"
run="$B/libddp/ddprun --nproc-per-node 1 --standalone $B/benchmarks/scaling/scaling_bench --model llama"
z="--sharding gradients --param-dtype bf16 --copy-engine-reductions"
f="--precision fp8 --fp8-fast-accum --warmup 4 --steps 6"
timeout 60 $run $f --json "$OUT/rows.jsonl" --profile-trace /tmp/plain.json > /tmp/a.log 2>&1; echo "plain rc=$? at $SECONDS s"
timeout 60 $run $f $z --json "$OUT/rows.jsonl" --profile-trace /tmp/zero2.json > /tmp/b.log 2>&1; echo "zero2 rc=$? at $SECONDS s"
python3 benchmarks/scaling/kernel_diff.py --labels plain,zero2 --top 25 --width 150 /tmp/plain.json /tmp/zero2.json > "$OUT/diff-fp8-plain-zero2.txt" 2>&1
grep -v "^ *[0-9.]* ms at\|before " "$OUT/diff-fp8-plain-zero2.txt" | head -40
b="--precision bf16 --warmup 4 --steps 12 --cuda-graph"
timeout 60 $run $b --json "$OUT/rows.jsonl" > /dev/null 2>&1; echo "bf16 plain rc=$?"
timeout 60 $run $b $z --json "$OUT/rows.jsonl" > /dev/null 2>&1; echo "bf16 zero2 rc=$?"
timeout 60 $run $b --sharding gradients --copy-engine-reductions --json "$OUT/rows.jsonl" > /dev/null 2>&1; echo "bf16 zero2 fp32 units rc=$?"
timeout 60 $run --precision fp8 --fp8-fast-accum --warmup 4 --steps 12 --cuda-graph --sharding gradients --copy-engine-reductions --json "$OUT/rows.jsonl" > /dev/null 2>&1; echo "fp8 zero2 fp32 units rc=$?"
python3 - "$OUT" <<'PY'
import json, sys
for r in map(json.loads, open(sys.argv[1] + "/rows.jsonl")):
    print(r["precision"], r["gpus"], r.get("sharding", "-"), r.get("param_dtype"), r.get("cuda_graph"), round(r["throughput"]), r.get("step_ms"))
PY
