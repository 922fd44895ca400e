#!/usr/bin/env bash
# Session 16, call 2 (warm, same 2-GPU machine and branch as call 1; carry [".dbg/s16call2.sh"]): LLaMA-1.1B bf16
# captured, plain 1 GPU; 2 GPUs on the copy engines: ZeRO-1 and ZeRO-2 with bf16 units (the branch), ZeRO-1 fp32,
# ZeRO-2 fp32, ZeRO-3 bf16 units (the best so far, 96.0%); ZeRO-2 bf16 units at 1 GPU; PyTorch eager 1 and 2 GPUs.
set -u
: "${OUT:?}"
B=build/gpu
[[ -x $B/benchmarks/scaling/scaling_bench ]] || { timeout 300 bash cmake/scripts/gpu_check.sh "$OUT" build_only > /tmp/b.log 2>&1; echo "rebuilt rc=$?"; }
bench="$B/benchmarks/scaling/scaling_bench --model llama --precision bf16 --steps 12 --warmup 4 --cuda-graph --json $OUT/rows.jsonl"
run() {  # run NAME NPROC FLAGS...
  local name=$1 n=$2; shift 2
  [[ $SECONDS -gt 520 ]] && { echo "$name skipped (time)"; return; }
  timeout 55 $B/libddp/ddprun --nproc-per-node "$n" --standalone $bench "$@" >> /tmp/runs.log 2>&1; echo "$name rc=$? at $SECONDS s"
}
run plain-1 1
run zero1-bf16-2 2 --sharding optimizer --param-dtype bf16 --copy-engine-reductions
run zero2-bf16-2 2 --sharding gradients --param-dtype bf16 --copy-engine-reductions
run zero3-bf16-2 2 --sharding full --param-dtype bf16 --copy-engine-reductions
run zero1-fp32-2 2 --sharding optimizer --copy-engine-reductions
run zero2-fp32-2 2 --sharding gradients --copy-engine-reductions
run zero2-bf16-1 1 --sharding gradients --param-dtype bf16
run zero1-bf16-2-again 2 --sharding optimizer --param-dtype bf16 --copy-engine-reductions
py="benchmarks/scaling/pytorch_ddp.py --model llama --preset tinyllama-1.1b --seq 2048 --batch 4 --precision bf16 --steps 12 --warmup 4 --json $OUT/pytorch.jsonl"
for n in 1 2; do
  [[ $SECONDS -gt 500 ]] && break
  timeout 70 python3 -m torch.distributed.run --standalone --nproc-per-node $n $py >> /tmp/runs.log 2>&1; echo "pytorch $n rc=$? at $SECONDS s"
done
tail -c 3000 /tmp/runs.log > "$OUT/runs-tail.log"
python3 - "$OUT" <<'PY'
import json, sys
for f in ("rows", "pytorch"):
    try:
        for r in map(json.loads, open(f"{sys.argv[1]}/{f}.jsonl")):
            print(f, r["gpus"], r.get("sharding"), r.get("param_dtype"), r["throughput"], r["step_ms"], r.get("peak_mem_gib"))
    except FileNotFoundError:
        print("no", f)
PY
