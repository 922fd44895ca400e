#!/usr/bin/env bash
# Session 24 call 4 (one H200, the last 5 minutes of device time; main b6081a4): the FP8 GPU tests after the skip
# helper (ddp_add_test FLOAT8, DDP_SKIP_WITHOUT_FLOAT8) built with -Werror: on an H200 they must run, not skip.
set -u
: "${OUT:?}"
bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target ddp_float8_gpu_tests ddp_precision_gpu_tests ddp_sharding_gpu_tests > /tmp/build.log 2>&1
echo "build rc=$? at $SECONDS s"; grep -E "error" /tmp/build.log | head -5
timeout $((225 - SECONDS)) ctest --test-dir build/gpu -R "Float8" -E "Float8ScalingState" > "$OUT/tests.log" 2>&1
echo "tests rc=$? at $SECONDS s"; grep -E "tests passed|Failed|Skipped|Not Run" "$OUT/tests.log" | head -12
