#!/usr/bin/env bash
# Session 8, call 5 (two GPUs): build; SyncBatchNorm over NCCL (and the Join tests again at this commit).
set -u
cd "$(dirname "$0")/.."
export DDP_GIT_COMMIT=${DDP_GIT_COMMIT:-wip}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L
CTEST_ARGS="-R DdpNccl.(SyncBatchNorm|Join)" timeout 400 bash cmake/scripts/gpu_check.sh $OUT ctest_gpu > $OUT/gpu_check.log 2>&1
echo "rc=$? after $SECONDS s"
grep -c "warning:" $OUT/build.log; grep -E "warning:|error:" $OUT/build.log | head -5 | cut -c1-300
grep -E "tests passed|DdpNccl.*(Passed|Failed)|rank [01] exit|differs" $OUT/ctest_gpu.log | head -12 | cut -c1-300
