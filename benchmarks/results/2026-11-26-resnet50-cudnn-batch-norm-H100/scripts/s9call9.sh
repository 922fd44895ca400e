#!/usr/bin/env bash
# Session 9, call 9 (one GPU, no build): one profiled step of PyTorch DDP under torch.compile reduce-overhead,
# ResNet-50 bf16, and its kernels against libddp's (cuDNN fused BatchNorm) trace from call 5.
set -u
cd "$(dirname "$0")/.."
nvidia-smi -L
R=benchmarks/results/2026-11-26-resnet50-cudnn-batch-norm-H100
gunzip -c $R/profile-resnet50-bf16-auto.json.gz > $OUT/libddp.json
timeout 300 python3 -m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/scaling/pytorch_ddp.py \
  --model resnet50 --precision bf16 --compile reduce-overhead --warmup 5 --steps 5 --json $OUT/rows.jsonl \
  --profile-trace $OUT/compile-graphs.json > $OUT/compile-graphs.log 2>&1
echo "profile rc=$? after $SECONDS s"; tail -3 $OUT/compile-graphs.log | cut -c1-300
python3 benchmarks/scaling/kernel_diff.py --labels libddp,compile-graphs --top 30 $OUT/libddp.json $OUT/compile-graphs.json \
  > $OUT/kernel-diff.txt 2>&1; head -40 $OUT/kernel-diff.txt | cut -c1-220
rm -f $OUT/libddp.json; gzip $OUT/compile-graphs.json
