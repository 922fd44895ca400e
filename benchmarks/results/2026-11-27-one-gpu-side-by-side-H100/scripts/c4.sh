#!/usr/bin/env bash
# Session 19 call 4 (one GPU; carry .dbg/c4.sh): build; then one lease: libddp's captured step against torch.compile of
# the bare model (pytorch_ddp.py's one-process default since this call) and of the DDP-wrapped one
# (--ddp-at-one-process, what the one-GPU compile rows ran before), LLaMA-1.1B and ResNet-50 bf16.
set -u
: "${OUT:?}"
nvidia-smi -L
timeout 300 bash cmake/scripts/gpu_check.sh "$OUT" none > /tmp/gpu_check.log 2>&1; echo "build rc=$? at $SECONDS s"
B=build/gpu
lb() {  # lb NAME FLAGS...
  local name=$1; shift
  timeout 70 $B/libddp/ddprun --nproc-per-node 1 --standalone $B/benchmarks/scaling/scaling_bench --steps 12 --warmup 4 \
    --cuda-graph --json "$OUT/rows.jsonl" "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s"; tail -c 300 /tmp/run.log | grep -i error
}
pt() {  # pt NAME FLAGS...
  local name=$1; shift
  local left=$((590 - SECONDS)); ((left > 150)) && left=150
  timeout $left python3 -m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/scaling/pytorch_ddp.py \
    --steps 12 --warmup 4 --compile default --json "$OUT/rows.jsonl" "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s"; tail -c 300 /tmp/run.log | grep -i error
}
lb libddp-llama --model llama --precision bf16
pt compile-bare-llama --model llama --precision bf16
lb libddp-resnet --model resnet50 --precision bf16
pt compile-bare-resnet --model resnet50 --precision bf16
pt compile-wrapped-resnet --model resnet50 --precision bf16 --ddp-at-one-process
pt compile-wrapped-llama --model llama --precision bf16 --ddp-at-one-process
python3 - "$OUT" <<'PY'
import json, sys
for l in open(sys.argv[1] + "/rows.jsonl"):
    r = json.loads(l)
    print(r.get("impl"), r["model"], r.get("ddp_wrapped", "-"), round(r["throughput"], 1), round(r["step_ms"], 2),
          r.get("peak_mem_gib"), r.get("compile_s"))
PY
