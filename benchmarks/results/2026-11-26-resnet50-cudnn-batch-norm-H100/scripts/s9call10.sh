#!/usr/bin/env bash
# Session 9, call 10 (one GPU): build; train_resnet50 --sync-bn with the default (captured) step on one GPU:
# SyncBatchNorm's all-reduces recorded into the CUDA graph; eager for comparison.
set -u
cd "$(dirname "$0")/.."
export DDP_GIT_COMMIT=${DDP_GIT_COMMIT:-wip}
nvidia-smi -L
timeout 300 bash cmake/scripts/gpu_check.sh $OUT build_only > $OUT/gpu_check.log 2>&1
echo "build rc=$? after $SECONDS s"
b=build/gpu
for graph in auto off; do
  timeout 120 $b/libddp/ddprun --nproc-per-node 1 --standalone $b/examples/resnet50/train_resnet50 --sync-bn \
    --precision bf16 --batch 32 --image-size 96 --classes 10 --steps 30 --warmup 3 --lr 0.02 --log-every 10 \
    --eval-batches 2 --cuda-graph $graph > $OUT/sync-bn-$graph.log 2>&1
  echo "--sync-bn --cuda-graph $graph rc=$?"; grep -E "recorded|step (10|20|30)/|top-1|error" $OUT/sync-bn-$graph.log | cut -c1-160
done
