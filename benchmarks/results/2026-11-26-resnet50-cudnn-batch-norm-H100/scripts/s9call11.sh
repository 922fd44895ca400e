#!/usr/bin/env bash
# Session 9, call 11 (one GPU): build at the review mend (cuDNN backward without a second size query);
# BatchNorm GPU tests and the ResNet example's GPU test; fused_bn_bench bf16; captured step --bn auto.
set -u
cd "$(dirname "$0")/.."
export DDP_GIT_COMMIT=${DDP_GIT_COMMIT:-wip}
nvidia-smi -L
CTEST_ARGS="-R FusedBatchNorm|ExamplesGpu.CapturedResnet" timeout 330 bash cmake/scripts/gpu_check.sh $OUT ctest_gpu > $OUT/gpu_check.log 2>&1
echo "rc=$? after $SECONDS s"; grep -c "warning:" $OUT/build.log
grep -E "tests passed|tests failed|Failed  " $OUT/ctest_gpu.log | head -5
b=build/gpu
timeout 60 $b/benchmarks/batchnorm/fused_bn_bench --dtype bf16 > $OUT/fused_bn_bench_bf16.md 2>&1; tail -1 $OUT/fused_bn_bench_bf16.md
timeout 80 $b/libddp/ddprun --nproc-per-node 1 --standalone $b/benchmarks/scaling/scaling_bench --model resnet50 \
  --precision bf16 --cuda-graph --bn auto --warmup 10 --steps 30 --json $OUT/step.jsonl > $OUT/step.log 2>&1
echo "step rc=$?: $(grep -o '"step_ms": [0-9.]*, "throughput": [0-9.]*' $OUT/step.jsonl)"
