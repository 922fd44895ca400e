#!/usr/bin/env bash
# Session 12 call 6 (2 GPUs, no build): PyTorch DDP eager, LLaMA-1.1B bf16 and ResNet-50 bf16 on 1 and 2 GPUs,
# for the efficiency beside call 5's libddp rows (same kind of machine, another lease).
set -u
: "${OUT:?}"
for m in "llama --preset tinyllama-1.1b --seq 2048 --batch 4" "resnet50 --image-size 224 --batch 128"; do
  for g in 1 2; do
    timeout 75 python3 -m torch.distributed.run --standalone --nproc-per-node $g benchmarks/scaling/pytorch_ddp.py \
      --model $m --precision bf16 --steps 12 --warmup 4 --json "$OUT/pytorch.jsonl" > "$OUT/pt-${m%% *}-$g.log" 2>&1
    echo "${m%% *} $g rc=$?"
  done
done
nvidia-smi --query-gpu=name --format=csv > "$OUT/gpus.csv"
python3 - "$OUT" <<'PY'
import json, sys
for r in map(json.loads, open(sys.argv[1] + "/pytorch.jsonl")):
    print(r.get("model"), r["impl"], r["gpus"], r["throughput"], r["step_ms"], r.get("backward_ms"))
PY
