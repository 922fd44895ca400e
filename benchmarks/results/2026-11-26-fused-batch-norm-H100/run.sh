#!/usr/bin/env bash
# Session 8, call 3 (one GPU): build; fused BatchNorm tests; fused_bn_bench (bf16, fp32); train_resnet50 bf16
# batch 128 on synthetic data with --bn aten | fused, eager and --cuda-graph, in one lease.
set -u
cd "$(dirname "$0")/.."
export DDP_GIT_COMMIT=${DDP_GIT_COMMIT:-wip}
nvidia-smi -L
CTEST_ARGS="-R FusedBatchNorm" timeout 330 bash cmake/scripts/gpu_check.sh $OUT ctest_gpu > $OUT/gpu_check.log 2>&1
echo "rc=$? after $SECONDS s"
grep -c "warning:" $OUT/build.log; grep -E "warning:|error:" $OUT/build.log | head -5 | cut -c1-300
grep -E "tests passed|FusedBatchNorm.*(Passed|Failed)|largest difference" $OUT/ctest_gpu.log | head -10 | cut -c1-300
b=build/gpu
for dtype in bf16 fp32; do
  timeout 120 $b/benchmarks/batchnorm/fused_bn_bench --dtype $dtype > $OUT/fused_bn_bench_$dtype.md 2>&1
  echo "fused_bn_bench $dtype rc=$?"; tail -1 $OUT/fused_bn_bench_$dtype.md
done
for graph in "" "--cuda-graph"; do
  for bn in aten fused; do
    name=resnet50-bf16-$bn${graph:+-graph}
    timeout 150 $b/libddp/ddprun --nproc-per-node 1 --standalone $b/examples/resnet50/train_resnet50 --precision bf16 \
      --batch 128 --steps 80 --warmup 5 --log-every 20 --eval-batches 2 --bn $bn $graph > $OUT/$name.log 2>&1
    echo "$name rc=$?"; grep -E "step (40|60|80)/|error" $OUT/$name.log | cut -c1-200
  done
done
