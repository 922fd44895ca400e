#!/usr/bin/env bash
# For the next one-GPU call (prepared in session 29, not run: no device time left). The FP8 tile kernel with fewer
# instructions per element (float8-tile-fewer-instructions.patch, beside this script): SwiGLU's sigmoid on the fast
# exponential and division, and no clamp before the conversion (its SATFINITE already saturates). Static SASS
# counts (sm_90, nvcc 13, session 29): SwiGLU forward 1,592 -> 1,216 instructions, its gradient 2,328 -> 1,912,
# the bf16 cast 1,840 -> 1,576. The patched tree's FP8 GPU tests (the saturation test among them), then LLaMA-1.1B
# fp8 captured, main against patched, alternating, two rounds, and one profiled replay of each with the FP8
# kernels' bandwidth against the device copy. About 8 minutes.
set -u
: "${OUT:?}"
here=benchmarks/results/2026-11-29-h200-session29/scripts
nvidia-smi -L
mkdir -p /tmp/patched && tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C /tmp/patched
(cd /tmp/patched && patch -p1 -s < "$OLDPWD/$here/float8-tile-fewer-instructions.patch") || { echo "patch does not apply"; exit 1; }
for tree in . /tmp/patched; do
  (cd $tree && bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 \
     > /tmp/configure.log 2>&1 && cmake --build build/gpu --target scaling_bench ddprun > /tmp/build.log 2>&1)
  echo "$tree build rc=$? at $SECONDS s"
done
(cd /tmp/patched && cmake --build build/gpu --target ddp_float8_gpu_tests > /tmp/build-tests.log 2>&1 && cd build/gpu && \
   timeout 150 ctest -R "Float8" --output-on-failure > "$OUT/tests.log" 2>&1)
echo "tests rc=$? at $SECONDS s"; grep -E "tests passed|Failed|FAILED" "$OUT/tests.log" | head
lb() {  # lb TREE NAME FLAGS...
  local tree=$1 name=$2; shift 2
  timeout 120 $tree/build/gpu/libddp/ddprun --nproc-per-node 1 --standalone $tree/build/gpu/benchmarks/scaling/scaling_bench \
    --json "$OUT/rows.jsonl" "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s $(tail -1 "$OUT/rows.jsonl" | grep -o '"step_ms": [0-9.]*')"
}
r="--model llama --steps 12 --warmup 4 --cuda-graph --precision fp8 --fp8-fast-accum"
for round in 1 2; do
  lb . main-$round $r
  lb /tmp/patched patched-$round $r
done
lb . main-profiled $r --profile-trace /tmp/main.json
lb /tmp/patched patched-profiled $r --profile-trace /tmp/patched.json
for trace in main patched; do
  echo "$trace:"; python3 $here/float8_kernel_bandwidth.py /tmp/$trace.json
done | tee "$OUT/float8-kernels.txt"
