#!/usr/bin/env bash
# For the next session with a two-GPU machine (nvidia-h200-x2, or nvidia-h100-x2): what 4622cea, c2c10d2 and
# 4228764 changed in the fused and synchronised BatchNorm has run only on the CPU. One call: build, the
# BatchNorm / SyncBatchNorm / ResNet GPU tests on both GPUs (FusedBatchNorm.SynchronisedOverNcclMatchesOneProcess
# now has an empty rank with NCHW strides and an NCHW case), then ResNet-50 bf16 with --sync-bn on both sides
# (libddp captured against torch.nn.SyncBatchNorm under PyTorch DDP, never run on CUDA), 1 and 2 GPUs.
#   run: bash benchmarks/results/2026-11-28-no-device-time/scripts/two-gpus-batch-norm.sh
set -u
: "${OUT:?}"
CTEST_ARGS="-R (BatchNorm|SyncBatchNorm|Resnet)" bash cmake/scripts/gpu_check.sh "$OUT" ctest_gpu
grep -E "tests passed|tests failed|\*\*\*Failed|Skipped" "$OUT/ctest_gpu.log" | head -20
echo "tests done at $SECONDS s"
timeout 420 python3 benchmarks/scaling/run_scaling.py --build build/gpu --gpus 1,2 --models resnet50 --precisions bf16 \
  --impls libddp-graph,pytorch --sync-bn --steps 15 --warmup 5 --timeout 200 --out "$OUT" --prefix sync-bn-resnet50 \
  > "$OUT/sync-bn-scaling.log" 2>&1
echo "run_scaling rc=$? at $SECONDS s"; grep -E "img/s|error|unavailable" "$OUT/sync-bn-scaling.log" | head -12
