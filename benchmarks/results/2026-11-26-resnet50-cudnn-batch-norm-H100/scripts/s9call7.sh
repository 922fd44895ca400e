#!/usr/bin/env bash
# Session 9, call 7 (asked for an H200): build; run_scaling ResNet-50 bf16: libddp, libddp-graph, PyTorch eager,
# torch.compile default and reduce-overhead.
set -u
cd "$(dirname "$0")/.."
export DDP_GIT_COMMIT=${DDP_GIT_COMMIT:-wip}
nvidia-smi -L; lscpu | grep -E "Model name"
timeout 300 bash cmake/scripts/gpu_check.sh $OUT build_only > $OUT/gpu_check.log 2>&1
echo "build rc=$? after $SECONDS s"
timeout $((585 - SECONDS)) python3 benchmarks/scaling/run_scaling.py --build build/gpu --out $OUT --prefix scaling-resnet50-bf16 \
  --gpus 1 --models resnet50 --precisions bf16 \
  --impls libddp,libddp-graph,pytorch,pytorch-compile,pytorch-compile-graphs > $OUT/run_scaling.log 2>&1
echo "run_scaling rc=$? after $SECONDS s"
grep -E "img/s, " $OUT/run_scaling.log | cut -c1-200
tar czf $OUT/all.tgz -C $OUT --exclude all.tgz . 2>/dev/null
