#!/usr/bin/env bash
# For the next session with device time, on nvidia-h200-x2: the copy-engine reduction's sum kernel
# (reduce_chunk_kernel, 2.9 ms a step beside LLaMA fp8's backward at two GPUs, session 25 call 4) launched with at
# most 132 or 264 blocks instead of 1024, so that it takes fewer SMs from the backward it overlaps: three trees built
# side by side (this one, and reduce-grid-132.patch / reduce-grid-264.patch applied), LLaMA-1.1B fp8 and bf16 at two
# GPUs (captured, ZeRO-2 with bf16 units, copy engines), alternating, two rounds. About 8 minutes.
set -u
: "${OUT:?}"
nvidia-smi -L
here=$(pwd)
scripts=$here/benchmarks/results/2026-11-28-h200-pair-4/scripts
for cap in 132 264; do
  mkdir -p /tmp/cap$cap && tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C /tmp/cap$cap
  (cd /tmp/cap$cap && patch -s -p1 < "$scripts/reduce-grid-$cap.patch") || echo "patch $cap failed"
done
build() {  # build TREE
  (cd "$1" && bash cmake/scripts/configure.sh python build/gpu -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure-$(basename "$1").log 2>&1 \
    && cmake --build build/gpu --target scaling_bench ddprun > /tmp/build-$(basename "$1").log 2>&1)
  echo "build $1 rc=$? at $SECONDS s"
}
build "$here"
build /tmp/cap132 & build /tmp/cap264 & wait
mkdir -p /tmp/rows
lb() {  # lb NAME TREE FLAGS...
  local name=$1 tree=$2; shift 2
  (( SECONDS > 560 )) && { echo "$name skipped at $SECONDS s"; return; }
  timeout 45 $tree/build/gpu/libddp/ddprun --nproc-per-node 2 --standalone $tree/build/gpu/benchmarks/scaling/scaling_bench \
    --json /tmp/rows/$name.jsonl "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s $(tail -c 300 /tmp/run.log | grep -i error)"
  [[ -f /tmp/rows/$name.jsonl ]] && sed "s/^{/{\"label\": \"$name\", /" /tmp/rows/$name.jsonl >> "$OUT/rows.jsonl"
}
c="--model llama --steps 12 --warmup 4 --cuda-graph --copy-engine-reductions --sharding gradients --param-dtype bf16"
for round in 1 2; do
  for precision in "fp8 --fp8-fast-accum" "bf16"; do
    for tree in "$here" /tmp/cap132 /tmp/cap264; do
      t=$(basename "$tree"); [[ $tree == "$here" ]] && t=cap1024
      lb "${precision%% *}-$t-$round" "$tree" $c --precision $precision
    done
  done
done
python3 -c 'import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r["label"], round(r["throughput"]), r["step_ms"])' "$OUT/rows.jsonl"
