#!/usr/bin/env bash
# For the next session with device time (one GPU): the GPU tests of what changed after session 23's last device
# call (af7d022: save_scaling commits on a copy and writes host copies; 0716bfd: the fused q/k/v checks), i.e. the
# FP8 checkpoint tests and the LLaMA fused-op tests, at the current main.
set -u
: "${OUT:?}"
nvidia-smi -L
bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target ddp_sharding_gpu_tests ddp_llama_gpu_tests ddp_example_gpu_tests ddp_unit_tests \
  train_llama train_resnet50 ddprun > /tmp/build.log 2>&1
echo "build rc=$? at $SECONDS s"; grep -E "error" /tmp/build.log | head -5
ctest --test-dir build/gpu -R "ShardingCuda|LlamaFusedOps|Fp8LlamaRun|Float8ScalingState" --output-on-failure \
  > "$OUT/tests.log" 2>&1
echo "tests rc=$? at $SECONDS s"; grep -E "Passed|Failed|Skipped|exit code" "$OUT/tests.log" | head -24
