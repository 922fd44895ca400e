#!/usr/bin/env bash
# Session 29 call 2 (one H200): ResNet-50's BatchNorm batch counts in one _foreach_add_ (batch-counters.patch,
# beside this script, applied in this tree) against a copy with the patch reversed (53 adds, one per layer): bf16
# and tf32 captured, alternating, two rounds; one profiled bf16 replay of each, diffed by kernel. About 6 minutes.
set -u
: "${OUT:?}"
here=benchmarks/results/2026-11-29-h200-session29/scripts
nvidia-smi -L
mkdir -p /tmp/base && tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C /tmp/base
(cd /tmp/base && patch -R -p1 -s < "$OLDPWD/$here/batch-counters.patch") || { echo "patch does not reverse"; exit 1; }
for tree in . /tmp/base; do
  (cd $tree && bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 \
     > /tmp/configure.log 2>&1 && cmake --build build/gpu --target scaling_bench ddprun > /tmp/build.log 2>&1)
  echo "$tree build rc=$? at $SECONDS s"
done
lb() {  # lb TREE NAME FLAGS...
  local tree=$1 name=$2; shift 2
  timeout 120 $tree/build/gpu/libddp/ddprun --nproc-per-node 1 --standalone $tree/build/gpu/benchmarks/scaling/scaling_bench \
    --json "$OUT/rows.jsonl" "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s $(tail -1 "$OUT/rows.jsonl" | grep -o '"step_ms": [0-9.]*')"
}
r="--model resnet50 --steps 20 --warmup 5 --cuda-graph"
for round in 1 2; do
  for p in bf16 tf32; do
    lb . counted-once-$p-$round $r --precision $p
    lb /tmp/base per-layer-$p-$round $r --precision $p
  done
done
lb . counted-once-profiled $r --precision bf16 --profile-trace /tmp/once.json
lb /tmp/base per-layer-profiled $r --precision bf16 --profile-trace /tmp/per-layer.json
python3 benchmarks/scaling/kernel_diff.py --labels per-layer,once --top 12 --gaps 3 --width 110 /tmp/per-layer.json \
  /tmp/once.json > "$OUT/diff-counters.txt" 2>&1
head -3 "$OUT/diff-counters.txt"
gzip -c /tmp/once.json > "$OUT/resnet-bf16.json.gz"
