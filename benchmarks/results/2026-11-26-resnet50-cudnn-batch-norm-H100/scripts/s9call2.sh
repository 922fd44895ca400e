#!/usr/bin/env bash
# Session 9, call 2 (one GPU): build; fused_bn_bench GPU-timed (graphs) bf16, fp32; run_scaling ResNet-50 bf16 with
# libddp (fused), libddp-graph, libddp-unfused, PyTorch eager, torch.compile default and reduce-overhead.
set -u
cd "$(dirname "$0")/.."
export DDP_GIT_COMMIT=${DDP_GIT_COMMIT:-wip}
nvidia-smi -L; lscpu | grep -E "Model name"
timeout 300 bash cmake/scripts/gpu_check.sh $OUT build_only > $OUT/gpu_check.log 2>&1
echo "build rc=$? after $SECONDS s"; grep -c "warning:" $OUT/build.log; grep -E "warning:|error:" $OUT/build.log | head -5 | cut -c1-300
b=build/gpu
for dtype in bf16 fp32; do
  timeout 100 $b/benchmarks/batchnorm/fused_bn_bench --dtype $dtype > $OUT/fused_bn_bench_$dtype.md 2>&1
  echo "fused_bn_bench $dtype rc=$?"; tail -1 $OUT/fused_bn_bench_$dtype.md | cut -c1-300
done
timeout 420 python3 benchmarks/scaling/run_scaling.py --build build/gpu --out $OUT --prefix scaling-resnet50-bf16 --gpus 1 \
  --models resnet50 --precisions bf16 \
  --impls libddp,libddp-graph,libddp-unfused,pytorch,pytorch-compile,pytorch-compile-graphs > $OUT/run_scaling.log 2>&1
echo "run_scaling rc=$? after $SECONDS s"
grep -E "^\| bf16" $OUT/scaling-resnet50-bf16.md | cut -c1-900
tar czf $OUT/all.tgz -C $OUT --exclude all.tgz . 2>/dev/null
