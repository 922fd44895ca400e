#!/usr/bin/env bash
# Session 9, call 1 (one GPU): build; fused BatchNorm + example GPU tests; fused_bn_bench with cuDNN's fused path
# (bf16, fp16); make_images + loader_bench; train_resnet50 on the gratings, fused vs aten BatchNorm, 2 seeds each.
set -u
cd "$(dirname "$0")/.."
export DDP_GIT_COMMIT=${DDP_GIT_COMMIT:-wip}
nvidia-smi -L; lscpu | grep -E "Model name|^CPU\(s\)"
CTEST_ARGS="-R FusedBatchNorm|ExamplesGpu" timeout 330 bash cmake/scripts/gpu_check.sh $OUT ctest_gpu > $OUT/gpu_check.log 2>&1
echo "rc=$? after $SECONDS s"
grep -c "warning:" $OUT/build.log; grep -E "warning:|error:" $OUT/build.log | head -5 | cut -c1-300
grep -E "tests passed|(FusedBatchNorm|ExamplesGpu).*(Passed|Failed)|largest|mean loss" $OUT/ctest_gpu.log | head -14 | cut -c1-300
b=build/gpu
for dtype in bf16 fp16; do
  timeout 100 $b/benchmarks/batchnorm/fused_bn_bench --dtype $dtype > $OUT/fused_bn_bench_$dtype.md 2>&1
  echo "fused_bn_bench $dtype rc=$?"; tail -2 $OUT/fused_bn_bench_$dtype.md | cut -c1-300
done
data=/tmp/gratings
timeout 60 $b/examples/make_images --output $data --classes 10 --train 6000 --val 1000 --size 256 > $OUT/make_images.log 2>&1
echo "make_images rc=$? after $SECONDS s"; cat $OUT/make_images.log
for workers in 6 12; do
  timeout 60 $b/benchmarks/data/loader_bench --data $data --batch 128 --crop 224 --workers $workers --batches 150 >> $OUT/loader.jsonl 2>&1
  echo "loader workers=$workers rc=$?"; tail -1 $OUT/loader.jsonl | cut -c1-300
done
for seed in 0 1; do
  for bn in fused aten; do
    name=gratings-$bn-seed$seed
    timeout 120 $b/libddp/ddprun --nproc-per-node 1 --standalone $b/examples/resnet50/train_resnet50 --data $data \
      --precision bf16 --batch 128 --steps 240 --warmup 24 --lr 0.1 --log-every 40 --eval-batches 7 --seed $seed \
      --bn $bn --metrics $OUT/$name.jsonl > $OUT/$name.log 2>&1
    echo "$name rc=$? after $SECONDS s"; grep -E "step (40|120|240)/|top-1|recorded|error" $OUT/$name.log | cut -c1-220
  done
done
