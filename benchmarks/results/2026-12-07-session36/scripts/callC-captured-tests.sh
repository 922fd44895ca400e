#!/usr/bin/env bash
# After the fix of the captured-step FP8 scenario (the inf in the target): build, then the captured-step and
# weight-cast GPU tests that inject an inf or run FP8 (the changed line takes the target only for FP8).
set -u
: "${OUT:?}"
SECONDS=0
export DDP_GIT_COMMIT=$1
nvidia-smi -L
{ bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 &&
  cmake --build build/gpu -j "$(nproc)" --target ddp_captured_gpu_tests ddp_float8_gpu_tests; } > "$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
echo "build at $SECONDS s"
(cd build/gpu && timeout 60 ctest -L gpu -R "^CapturedStep.Float8|^CapturedStep.GradScaler|Float8WeightCast" --output-on-failure > "$OUT/ctest.log" 2>&1)
echo "ctest rc=$? at $SECONDS s"
grep -E "tests passed|tests failed|\(Failed\)|Timeout|captured vs eager, 1 GPU, fp8" "$OUT/ctest.log" | head -20
