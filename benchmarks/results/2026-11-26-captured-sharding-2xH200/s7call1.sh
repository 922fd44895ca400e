#!/usr/bin/env bash
# Session 7, call 1 (two GPUs): build; the captured-step tests (kFull across ranks now recorded: units gathered and
# freed inside the graph; param_dtype bf16; find_unused+static_graph) and sparse gradients over NCCL.
set -u
cd "$(dirname "$0")/.."
export DDP_GIT_COMMIT=${DDP_GIT_COMMIT:-wip}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L
CTEST_ARGS="-R DdpNccl.Captured|DdpNccl.Recording|DdpNccl.Sparse|CapturedStep" timeout 330 bash cmake/scripts/gpu_check.sh $OUT ctest_gpu > $OUT/gpu_check.log 2>&1
echo "rc=$? after $SECONDS s"
grep -c "warning:" $OUT/build.log; grep -E "warning:|error:" $OUT/build.log | head -8 | cut -c1-300
grep -E "tests passed|\*\*\*Failed|\*\*\*Timeout|\*\*\*Skipped|Exception|CMake Error" $OUT/ctest_gpu.log | head -30
grep -E "^[0-9]+: captured vs eager|differs|what\(\)|Segmentation|Failure|illegal|rank [01]" $OUT/ctest_gpu.log | sort -u | head -30 | cut -c1-400
if grep -q "Failed.*FullySharded" $OUT/ctest_gpu.log; then
  echo "== kFull again with NCCL_GRAPH_REGISTER=0"
  NCCL_GRAPH_REGISTER=0 timeout 60 build/gpu/tests/ddp_ddp_nccl_tests --gtest_filter='DdpNccl.CapturedStepWithFullyShardedUnitsMatchesEager' 2>&1 | tail -15 | cut -c1-400
fi
