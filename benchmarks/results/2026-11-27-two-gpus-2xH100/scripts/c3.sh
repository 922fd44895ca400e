#!/usr/bin/env bash
# Session 18 call 3 (2 GPUs; carry .dbg/c3.sh): (re)build if needed; LLaMA examples bf16/fp16/fp8 on both GPUs;
# then one machine, interleaved: LLaMA-1.1B bf16 libddp (captured, copy engines, ZeRO-2 bf16 units, reduce bf16 and
# fp32) against PyTorch eager DDP 1 -> 2; ResNet-50 bf16 libddp captured copy engines 1 -> 2 against PyTorch eager.
set -u
: "${OUT:?}"
nvidia-smi -L
timeout 300 bash cmake/scripts/gpu_check.sh "$OUT" none > /tmp/gpu_check.log 2>&1; echo "build rc=$? at $SECONDS s"
B=build/gpu
for p in bf16 fp16 fp8; do
  timeout 60 $B/libddp/ddprun --nproc-per-node 2 --standalone $B/examples/llama/train_llama --preset tinyllama-1.1b \
    --precision $p --steps 10 --warmup 5 --log-every 10 --eval-batches 1 > /tmp/ex.log 2>&1
  echo "llama $p rc=$? at $SECONDS s: $(grep -E '\[rank0\]: step 10/' /tmp/ex.log | cut -c1-120)"
done
lb() {  # lb NAME NPROC FLAGS...
  local name=$1 n=$2; shift 2
  timeout 70 $B/libddp/ddprun --nproc-per-node "$n" --standalone $B/benchmarks/scaling/scaling_bench --steps 12 --warmup 4 \
    --cuda-graph --json "$OUT/rows.jsonl" "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s"; tail -c 300 /tmp/run.log | grep -i error
}
pt() {  # pt NAME NPROC FLAGS...
  local name=$1 n=$2; shift 2
  timeout 100 python3 -m torch.distributed.run --standalone --nproc-per-node $n benchmarks/scaling/pytorch_ddp.py \
    --steps 12 --warmup 4 --json "$OUT/rows.jsonl" "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s"; tail -c 300 /tmp/run.log | grep -i error
}
zero2="--sharding gradients --param-dtype bf16 --copy-engine-reductions"
lb llama-1 1 --model llama --precision bf16
lb llama-zero2-rbf16 2 --model llama --precision bf16 $zero2 --reduce-dtype bf16
pt pt-llama-1 1 --model llama --precision bf16
pt pt-llama-2 2 --model llama --precision bf16
lb llama-zero2-rfp32 2 --model llama --precision bf16 $zero2
lb resnet-1 1 --model resnet50 --precision bf16
lb resnet-2 2 --model resnet50 --precision bf16 --copy-engine-reductions
lb resnet-2-rbf16 2 --model resnet50 --precision bf16 --copy-engine-reductions --reduce-dtype bf16
pt pt-resnet-1 1 --model resnet50 --precision bf16
pt pt-resnet-2 2 --model resnet50 --precision bf16
python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/rows.jsonl")]
for r in rows:
    print(r.get("impl", "?"), r["model"], r["gpus"], r.get("sharding", "-"), r.get("param_dtype", "-"), r.get("reduce_dtype", "-"),
          r.get("cuda_graph", "-"), round(r["throughput"], 1), r.get("step_ms"), r.get("peak_mem_gib"))
PY
