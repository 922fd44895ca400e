#!/usr/bin/env bash
# Session 7, call 4 (two GPUs): build (warnings as errors); ddp::Join over NCCL (uneven batches) and the captured
# and sparse tests again at this commit; ddprun --doctor after the driver-banner fix.
set -u
cd "$(dirname "$0")/.."
export DDP_GIT_COMMIT=${DDP_GIT_COMMIT:-wip}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L
head -1 /proc/driver/nvidia/version
CTEST_ARGS="-R DdpNccl.Join|DdpNccl.Sparse|DdpNccl.Captured|CapturedStep" timeout 330 bash cmake/scripts/gpu_check.sh $OUT ctest_gpu > $OUT/gpu_check.log 2>&1
echo "rc=$? after $SECONDS s"
grep -c "warning:" $OUT/build.log; grep -E "warning:|error:" $OUT/build.log | head -8 | cut -c1-300
grep -E "tests passed|\*\*\*Failed|\*\*\*Timeout|\*\*\*Skipped|Exception|CMake Error" $OUT/ctest_gpu.log | head -30
grep -E "Join.*(Passed|Failed)|what\(\)|differs|rank [01] exit" $OUT/ctest_gpu.log | sort -u | head -20 | cut -c1-400
build/gpu/libddp/ddprun --doctor > $OUT/doctor.txt 2>&1; echo "doctor rc=$?"; head -3 $OUT/doctor.txt | cut -c1-300
