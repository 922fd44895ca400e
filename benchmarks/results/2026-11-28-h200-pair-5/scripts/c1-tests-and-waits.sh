#!/usr/bin/env bash
# Session 26 call 1 (2 x H200): the GPU tests of the paths 29b6b2b and a107b6b changed (session 25's review fixes
# of ShardedParameters' side stream and the loaders; the FP8 scaling-state refusal of sharded checkpoints), then
# c3-where-fp8-waits.sh's profile of LLaMA fp8's two-GPU step. About 6 minutes.
set -u
: "${OUT:?}"
here=$(dirname "$0")
nvidia-smi -L
bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target ddp_ddp_nccl_tests ddp_captured_gpu_tests ddp_sharding_gpu_tests ddp_float8_gpu_tests \
  scaling_bench ddprun > /tmp/build.log 2>&1
echo "build rc=$? at $SECONDS s"; grep -E "error" /tmp/build.log | head -5
timeout 300 ctest --test-dir build/gpu -R "DdpNccl\.(Sharded|CapturedStep|Join)|CapturedStep\.|ShardingCuda|Float8Cast\." \
  --output-on-failure > "$OUT/tests.log" 2>&1
echo "tests rc=$? at $SECONDS s"; grep -E "tests passed|Failed|exit code" "$OUT/tests.log" | head -12
bash "$here/c3-where-fp8-waits.sh"
