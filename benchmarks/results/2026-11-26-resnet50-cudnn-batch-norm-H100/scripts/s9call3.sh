#!/usr/bin/env bash
# Session 9, call 3 (one GPU): build; BatchNorm GPU tests (libddp and cuDNN paths) + examples; fused_bn_bench bf16/fp32
# (ATen, libddp kernels, cuDNN); the captured training step A/B: --bn libddp | auto (cuDNN) | aten, 2 rounds;
# gratings top-1 with --bn auto.
set -u
cd "$(dirname "$0")/.."
export DDP_GIT_COMMIT=${DDP_GIT_COMMIT:-wip}
nvidia-smi -L
CTEST_ARGS="-R FusedBatchNorm|ExamplesGpu" timeout 330 bash cmake/scripts/gpu_check.sh $OUT ctest_gpu > $OUT/gpu_check.log 2>&1
echo "rc=$? after $SECONDS s"
grep -c "warning:" $OUT/build.log; grep -E "warning:|error:" $OUT/build.log | head -5 | cut -c1-300
grep -E "tests passed|(FusedBatchNorm|ExamplesGpu).*(Passed|Failed)|mean loss|falls back|Failure" $OUT/ctest_gpu.log | head -14 | cut -c1-300
b=build/gpu
for dtype in bf16 fp32; do
  timeout 100 $b/benchmarks/batchnorm/fused_bn_bench --dtype $dtype > $OUT/fused_bn_bench_$dtype.md 2>&1
  echo "fused_bn_bench $dtype rc=$?"; tail -1 $OUT/fused_bn_bench_$dtype.md | cut -c1-300
done
for round in 1 2; do
  for bn in libddp auto aten; do
    timeout 90 $b/libddp/ddprun --nproc-per-node 1 --standalone $b/benchmarks/scaling/scaling_bench --model resnet50 \
      --precision bf16 --cuda-graph --bn $bn --warmup 10 --steps 30 --json $OUT/step-ab.jsonl > $OUT/step-ab-$bn-$round.log 2>&1
    echo "round $round --bn $bn rc=$?: $(tail -1 $OUT/step-ab.jsonl | grep -o '"step_ms": [0-9.]*, "throughput": [0-9.]*')"
  done
done
data=/tmp/gratings
timeout 60 $b/examples/make_images --output $data --classes 10 --train 6000 --val 1000 --size 256 > $OUT/make_images.log 2>&1
for seed in 0 1; do
  name=gratings-cudnn-seed$seed
  timeout 100 $b/libddp/ddprun --nproc-per-node 1 --standalone $b/examples/resnet50/train_resnet50 --data $data \
    --precision bf16 --batch 128 --steps 240 --warmup 24 --lr 0.1 --log-every 40 --eval-batches 7 --seed $seed \
    --bn auto --metrics $OUT/$name.jsonl > $OUT/$name.log 2>&1
  echo "$name rc=$? after $SECONDS s"; grep -E "step (240)/|top-1|error" $OUT/$name.log | cut -c1-220
done
tar czf $OUT/all.tgz -C $OUT --exclude all.tgz . 2>/dev/null
