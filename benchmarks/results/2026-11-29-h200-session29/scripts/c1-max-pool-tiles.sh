#!/usr/bin/env bash
# Session 29 call 1 (prepared in session 28 as next-max-pool-tiles.sh; run as is). ResNet-50's max-pool
# backward in 2x2 input tiles (max-pool-backward-tiles.patch, beside this script: one thread loads the four windows
# of a tile once, where a thread per pixel loads each window about nine times; the index math was checked against
# ATen on the CPU by max_pool_tile_check.py). The patched tree's ResNet kernel tests (bit for bit against ATen, the
# stem's shape and odd sizes at padding 1), the kernels' times in one profiled bf16 replay each, then ResNet-50 bf16
# and tf32 captured, main against patched, alternating, two rounds. About 7 minutes.
set -u
: "${OUT:?}"
here=benchmarks/results/2026-11-29-h200-session28/scripts
nvidia-smi -L
mkdir -p /tmp/patched && tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C /tmp/patched
(cd /tmp/patched && patch -p1 -s < "$here/max-pool-backward-tiles.patch") || { echo "patch does not apply"; exit 1; }
for tree in . /tmp/patched; do
  (cd $tree && bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 \
     > /tmp/configure.log 2>&1 && cmake --build build/gpu --target scaling_bench ddprun > /tmp/build.log 2>&1)
  echo "$tree build rc=$? at $SECONDS s"
done
(cd /tmp/patched && cmake --build build/gpu --target ddp_resnet_gpu_tests > /tmp/build-tests.log 2>&1 && cd build/gpu && \
   ctest -R "ResNetKernels" --output-on-failure > "$OUT/tests.log" 2>&1)
echo "tests rc=$? at $SECONDS s"; grep -E "tests passed|Failed|FAILED|differ" "$OUT/tests.log" | head
lb() {  # lb TREE NAME FLAGS...
  local tree=$1 name=$2; shift 2
  timeout 120 $tree/build/gpu/libddp/ddprun --nproc-per-node 1 --standalone $tree/build/gpu/benchmarks/scaling/scaling_bench \
    --json "$OUT/rows.jsonl" "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s $(tail -1 "$OUT/rows.jsonl" | grep -o '"step_ms": [0-9.]*')"
}
r="--model resnet50 --steps 20 --warmup 5 --cuda-graph"
lb . main-profiled $r --precision bf16 --profile-trace /tmp/main.json
lb /tmp/patched patched-profiled $r --precision bf16 --profile-trace /tmp/patched.json
for trace in main patched; do
  echo "$trace:"; python3 benchmarks/results/2026-11-28-h200-session27/scripts/max_pool_kernel_times.py /tmp/$trace.json
done | tee "$OUT/max-pool-kernels.txt"
for round in 1 2; do
  for p in bf16 tf32; do
    lb . main-$p-$round $r --precision $p
    lb /tmp/patched patched-$p-$round $r --precision $p
  done
done
