#!/usr/bin/env bash
# Session 26 call 3 (2 x H200): where LLaMA-1.1B fp8's two-GPU step (captured, ZeRO-2 with bf16 units, copy
# engines) loses the 1.9 ms of idle session 25 call 4 found: one profiled replay at two GPUs and one at one, the
# whole GPU's idle stretches (kernel_diff.py --gaps) and the compute stream's (stream_gaps.py) with what the other
# streams ran meanwhile. About 4 minutes.
set -u
: "${OUT:?}"
nvidia-smi -L
here=$(dirname "$0")
[[ -f build/gpu/build.ninja ]] || bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target scaling_bench ddprun > /tmp/build.log 2>&1
echo "build rc=$? at $SECONDS s"
B=build/gpu
lb() {  # lb NAME NPROC FLAGS...
  local name=$1 n=$2; shift 2
  timeout 60 $B/libddp/ddprun --nproc-per-node "$n" --standalone $B/benchmarks/scaling/scaling_bench \
    --json "$OUT/rows.jsonl" "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s $(tail -c 300 /tmp/run.log | grep -i error)"
}
l="--model llama --steps 12 --warmup 4 --cuda-graph --precision fp8 --fp8-fast-accum"
c="$l --copy-engine-reductions --sharding gradients --param-dtype bf16"
lb fp8-2gpus-profiled 2 $c --profile-trace /tmp/two.json
lb fp8-1gpu-profiled 1 $l --profile-trace /tmp/one.json
python3 benchmarks/scaling/kernel_diff.py --labels plain1,zero2x2 --top 30 --gaps 12 --width 110 /tmp/one.json /tmp/two.json \
  > "$OUT/diff-fp8-plain1-zero2x2.txt" 2>&1
for t in one two; do python3 "$here/stream_gaps.py" /tmp/$t.json --top 20 > "$OUT/stream-gaps-$t.txt" 2>&1; done
head -c 2500 "$OUT/stream-gaps-two.txt"; echo; head -c 1500 "$OUT/stream-gaps-one.txt"
sed -n '/idle stretches/,/^$/p' "$OUT/diff-fp8-plain1-zero2x2.txt" | head -60
