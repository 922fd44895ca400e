#!/usr/bin/env bash
# Session 9, call 6 (one GPU): train_resnet50 on the gratings (make_images), --bn auto (cuDNN) | libddp | aten,
# seeds 0-2, lr 0.05 with a 48-step warmup (lr 0.1 / 24 diverged early in call 1 and 3), captured step; top-1.
set -u
cd "$(dirname "$0")/.."
export DDP_GIT_COMMIT=${DDP_GIT_COMMIT:-wip}
nvidia-smi -L
timeout 300 bash cmake/scripts/gpu_check.sh $OUT build_only > $OUT/gpu_check.log 2>&1
echo "build rc=$? after $SECONDS s"
b=build/gpu data=/tmp/gratings
[[ -e $data/classes.txt ]] || timeout 60 $b/examples/make_images --output $data --classes 10 --train 6000 --val 1000 --size 256 > $OUT/make_images.log 2>&1
for seed in 0 1 2; do
  for bn in auto libddp aten; do
    name=gratings-$bn-seed$seed
    timeout 100 $b/libddp/ddprun --nproc-per-node 1 --standalone $b/examples/resnet50/train_resnet50 --data $data \
      --precision bf16 --batch 128 --steps 240 --warmup 48 --lr 0.05 --log-every 40 --eval-batches 7 --seed $seed \
      --bn $bn --metrics $OUT/$name.jsonl > $OUT/$name.log 2>&1
    echo "$name rc=$? after $SECONDS s: $(grep -oE 'step 40/240 \| loss [0-9.]+' $OUT/$name.log) $(grep -oE 'step 240/240 \| loss [0-9.]+' $OUT/$name.log) $(grep -oE 'top-1 [0-9.]+%' $OUT/$name.log)"
    [[ $SECONDS -gt 560 ]] && break 2
  done
done
tar czf $OUT/all.tgz -C $OUT --exclude all.tgz . 2>/dev/null
