#!/usr/bin/env bash
# Session 19 call 2 (2 GPUs; carry .dbg/c2.sh): build the fused synchronised BatchNorm; its NCCL test and the
# BatchNorm/SyncBatchNorm/captured-ResNet GPU tests; ResNet-50 bf16 on both GPUs, batch 64 per rank: --sync-bn on
# libddp's fused kernels (--bn auto), --sync-bn unfused (--bn aten: sync_batch_norm, add, ReLU), no SyncBatchNorm;
# then torch.compile + DDP LLaMA-1.1B on 2 GPUs (the row call 1 ran out of time for) beside libddp's.
set -u
: "${OUT:?}"
nvidia-smi -L
timeout 300 bash cmake/scripts/gpu_check.sh "$OUT" none > /tmp/gpu_check.log 2>&1; echo "build rc=$? at $SECONDS s"
grep -c "warning:" "$OUT/build.log"; grep -m3 -B2 -A3 "error" "$OUT/build.log" | head -20
timeout 200 ctest --test-dir build/gpu -L gpu -R "(FusedBatchNorm|SyncBatchNorm|ExamplesGpu.CapturedResnet)" \
  --output-on-failure > "$OUT/ctest.log" 2>&1
echo "ctest rc=$? at $SECONDS s"; grep -E "Test +#|tests passed|Failed|differs|rror" "$OUT/ctest.log" | head -30
B=build/gpu
for args in "--sync-bn --bn auto" "--sync-bn --bn aten" "--bn auto"; do
  timeout 100 $B/libddp/ddprun --nproc-per-node 2 --standalone $B/examples/resnet50/train_resnet50 --batch 64 \
    --precision bf16 --steps 60 --warmup 5 --log-every 20 --eval-batches 1 $args > /tmp/r.log 2>&1
  echo "resnet $args rc=$? at $SECONDS s"; grep -E "step (20|40|60)/|eval|rror" /tmp/r.log | grep -v rank1 | cut -c1-220
  cp /tmp/r.log "$OUT/resnet-${args// /_}.log"
done
timeout 60 $B/libddp/ddprun --nproc-per-node 2 --standalone $B/benchmarks/scaling/scaling_bench --model llama \
  --precision bf16 --batch 4 --preset tinyllama-1.1b --seq 2048 --steps 12 --warmup 4 --json "$OUT/llama2.jsonl" \
  --sharding gradients --param-dtype bf16 --copy-engine-reductions --cuda-graph > /tmp/l.log 2>&1
echo "libddp-graph-llama-2 rc=$? at $SECONDS s"; tail -c 400 /tmp/l.log | grep -iE "tok/s|error"
timeout $((590 - SECONDS)) python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
  benchmarks/scaling/pytorch_ddp.py --model llama --precision bf16 --batch 4 --preset tinyllama-1.1b --seq 2048 \
  --steps 12 --warmup 4 --json "$OUT/llama2.jsonl" --reduce-dtype fp32 --compile default > /tmp/c.log 2>&1
echo "pytorch-compile-llama-2 rc=$? at $SECONDS s"; tail -c 600 /tmp/c.log
cat "$OUT/llama2.jsonl" | cut -c1-400
