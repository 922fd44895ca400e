#!/usr/bin/env bash
# Session 8, call 4 (one GPU): build only; the one-lease ResNet-50 bf16 side-by-side (libddp with the fused
# BatchNorm, libddp captured, PyTorch eager, torch.compile), batch 128.
set -u
cd "$(dirname "$0")/.."
export DDP_GIT_COMMIT=${DDP_GIT_COMMIT:-wip}
nvidia-smi -L
timeout 300 bash cmake/scripts/gpu_check.sh $OUT build_only > $OUT/gpu_check.log 2>&1
echo "build rc=$? after $SECONDS s"; grep -c "warning:" $OUT/build.log
timeout $((590 - SECONDS)) python3 benchmarks/scaling/run_scaling.py --build build/gpu --out $OUT --prefix side-by-side-resnet50 \
  --gpus 1 --models resnet50 --precisions bf16 --impls libddp,libddp-graph,pytorch,pytorch-compile > $OUT/scaling.log 2>&1
echo "scaling rc=$? after $SECONDS s"; grep -E "img/s|error|failed" $OUT/scaling.log | cut -c1-250
grep -A4 "^| precision" $OUT/side-by-side-resnet50.md 2>/dev/null
