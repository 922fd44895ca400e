#!/usr/bin/env bash
# Session 9, call 8 (one GPU): build at the review mends (shared fp32 conversions, SM count from ATen); the BatchNorm
# and FP8 GPU tests; fused_bn_bench bf16; precision_bench (FP8 casts against copy bandwidth: issue 29's baseline);
# run_scaling LLaMA-1.1B bf16 and fp8 (libddp captured) against torch.compile (bf16), issue 29's baseline.
set -u
cd "$(dirname "$0")/.."
export DDP_GIT_COMMIT=${DDP_GIT_COMMIT:-wip}
nvidia-smi -L
CTEST_ARGS="-R FusedBatchNorm|Float8|Fp8" timeout 330 bash cmake/scripts/gpu_check.sh $OUT ctest_gpu > $OUT/gpu_check.log 2>&1
echo "rc=$? after $SECONDS s"
grep -c "warning:" $OUT/build.log; grep -E "warning:|error:" $OUT/build.log | head -5 | cut -c1-300
grep -E "tests passed|tests failed|Failed  " $OUT/ctest_gpu.log | head -8 | cut -c1-200
b=build/gpu
timeout 60 $b/benchmarks/batchnorm/fused_bn_bench --dtype bf16 > $OUT/fused_bn_bench_bf16.md 2>&1; tail -1 $OUT/fused_bn_bench_bf16.md
timeout 90 $b/benchmarks/precision/precision_bench --markdown $OUT/precision.md --json $OUT/precision.json > $OUT/precision.log 2>&1
echo "precision_bench rc=$?"; grep -iE "cast|copy" $OUT/precision.md | head -8 | cut -c1-250
timeout $((585 - SECONDS)) python3 benchmarks/scaling/run_scaling.py --build build/gpu --out $OUT --prefix scaling-llama \
  --gpus 1 --models llama --precisions bf16,fp8 --fp8-fast-accum --impls libddp-graph,pytorch-compile > $OUT/run_scaling.log 2>&1
echo "run_scaling rc=$? after $SECONDS s"
grep -E "tok/s, |error" $OUT/run_scaling.log | cut -c1-200
tar czf $OUT/all.tgz -C $OUT --exclude all.tgz . 2>/dev/null
