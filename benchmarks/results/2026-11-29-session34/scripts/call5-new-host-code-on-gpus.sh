#!/usr/bin/env bash
# Session 34 call 5 (two H200s, the last ~5 minutes of device time): this session's CPU-tested host code on the
# GPU paths it touches: Join with kFull over NCCL (the recording condition and the new agreement slots) and the
# examples' flag agreement (an int64 all-gather over NCCL) through the examples' GPU tests.
set -u
: "${OUT:?}"
SECONDS=0
nvidia-smi -L
{ bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 &&
  cmake --build build/gpu --target ddprun train_llama train_resnet50 ddp_example_gpu_tests ddp_ddp_nccl_tests; } \
  > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "build at $SECONDS s"
timeout 200 ctest --test-dir build/gpu -R "DdpNccl.Join|ExamplesGpu" --output-on-failure > "$OUT/ctest.log" 2>&1
echo "ctest rc=$? at $SECONDS s"; grep -E "Test +#|tests passed" "$OUT/ctest.log"
