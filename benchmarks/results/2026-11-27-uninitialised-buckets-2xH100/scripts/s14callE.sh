#!/usr/bin/env bash
# Session 14 call E (2 GPUs, cold): ZeRO-3 with bf16 parameters (--sharding full --param-dtype bf16) on the copy
# engines, captured, against its own 1-GPU run and against today's best (ZeRO-2 + copy engines); PyTorch eager DDP
# 1 and 2 GPUs in the same lease if time allows. LLaMA-1.1B bf16, 4 x 2048 tokens per GPU.
set -u
: "${OUT:?}"
timeout 240 bash cmake/scripts/gpu_check.sh "$OUT" none > "$OUT/gpu_check.log" 2>&1; echo "build rc=$? at $SECONDS s"
B=build/gpu
bench="$B/benchmarks/scaling/scaling_bench --model llama --precision bf16 --steps 12 --warmup 4 --cuda-graph"
run() {  # run NAME NPROC FLAGS...
  local name=$1 n=$2; shift 2
  timeout 60 $B/libddp/ddprun --nproc-per-node "$n" --standalone $bench "$@" --json "$OUT/$name.jsonl" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? at $SECONDS s"
}
run full-bf16-1gpu 1 --sharding full --param-dtype bf16
run full-bf16-2gpu 2 --sharding full --param-dtype bf16 --copy-engine-reductions
run none-1gpu 1
run gradients-2gpu 2 --sharding gradients --copy-engine-reductions
run full-bf16-2gpu-again 2 --sharding full --param-dtype bf16 --copy-engine-reductions
py="benchmarks/scaling/pytorch_ddp.py --model llama --preset tinyllama-1.1b --seq 2048 --batch 4 --precision bf16 --steps 12 --warmup 4"
for n in 1 2; do
  [[ $SECONDS -gt 300 ]] && break
  timeout 70 python3 -m torch.distributed.run --standalone --nproc-per-node $n $py --json "$OUT/pytorch-${n}gpu.jsonl" > "$OUT/pytorch-$n.log" 2>&1; echo "pytorch $n rc=$? at $SECONDS s"
done
python3 - "$OUT" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/*.jsonl")):
    for r in map(json.loads, open(f)):
        print(f.split("/")[-1], r["gpus"], r.get("sharding"), r.get("param_dtype"), r["throughput"], r["step_ms"], r.get("peak_mem_gib"))
PY
