#!/usr/bin/env bash
# Session 9, call 5 (one GPU): build; run_scaling ResNet-50 tf32 (libddp, libddp-graph, torch.compile default and
# reduce-overhead); one profiled libddp step with --bn aten and --bn auto (cuDNN's fused BatchNorm) and their kernel diff.
set -u
cd "$(dirname "$0")/.."
export DDP_GIT_COMMIT=${DDP_GIT_COMMIT:-wip}
nvidia-smi -L
timeout 300 bash cmake/scripts/gpu_check.sh $OUT build_only > $OUT/gpu_check.log 2>&1
echo "build rc=$? after $SECONDS s"
b=build/gpu
for bn in aten auto; do
  timeout 60 $b/libddp/ddprun --nproc-per-node 1 --standalone $b/benchmarks/scaling/scaling_bench --model resnet50 \
    --precision bf16 --bn $bn --warmup 5 --steps 5 --json $OUT/profile-rows.jsonl \
    --profile-trace $OUT/profile-resnet50-bf16-$bn.json > $OUT/profile-$bn.log 2>&1
  echo "profile --bn $bn rc=$?"
done
python3 benchmarks/scaling/kernel_diff.py --labels aten,cudnn-fused --top 25 $OUT/profile-resnet50-bf16-aten.json \
  $OUT/profile-resnet50-bf16-auto.json > $OUT/profile-kernel-diff.txt 2>&1
head -12 $OUT/profile-kernel-diff.txt | cut -c1-200
timeout $((585 - SECONDS)) python3 benchmarks/scaling/run_scaling.py --build build/gpu --out $OUT --prefix scaling-resnet50-tf32 \
  --gpus 1 --models resnet50 --precisions tf32 \
  --impls libddp,libddp-graph,pytorch-compile,pytorch-compile-graphs > $OUT/run_scaling.log 2>&1
echo "run_scaling rc=$? after $SECONDS s"
grep -E "img/s, " $OUT/run_scaling.log | cut -c1-200
gzip $OUT/profile-resnet50-bf16-*.json
tar czf $OUT/all.tgz -C $OUT --exclude all.tgz . 2>/dev/null
