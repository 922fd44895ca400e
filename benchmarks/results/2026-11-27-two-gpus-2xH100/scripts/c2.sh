#!/usr/bin/env bash
# Session 18 call 2 (warm 2 GPUs after c1, build/gpu kept; carry .dbg/c2.sh): LLaMA-1.1B bf16 captured on the
# copy engines, ZeRO-2 with bf16 units, gradients reduced in fp32 (default hook) against --reduce-dtype bf16, with
# the one-GPU baseline; then the examples on both GPUs (10 steps each) and the exact-resume check with a rank killed.
set -u
: "${OUT:?}"
nvidia-smi -L
B=build/gpu
bench="$B/benchmarks/scaling/scaling_bench --model llama --precision bf16 --steps 12 --warmup 4 --cuda-graph"
run() {  # run NAME NPROC FLAGS...
  local name=$1 n=$2; shift 2
  timeout 60 $B/libddp/ddprun --nproc-per-node "$n" --standalone $bench --json "$OUT/rows.jsonl" "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s"; tail -c 300 /tmp/run.log | grep -i error
}
zero2="--sharding gradients --param-dtype bf16 --copy-engine-reductions"
run zero2-fp32 2 $zero2
run zero2-bf16 2 $zero2 --reduce-dtype bf16
run plain-1 1
run zero2-bf16-again 2 $zero2 --reduce-dtype bf16
run zero2-fp32-again 2 $zero2
python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/rows.jsonl")]
base = [r for r in rows if r["gpus"] == 1][0]["throughput"]
for r in rows:
    print(r["gpus"], r["sharding"], r["param_dtype"], r["reduce_dtype"], r["throughput"], r["step_ms"], r["peak_mem_gib"], r["final_loss"], f'{100 * r["throughput"] / (r["gpus"] * base):.2f}%')
PY
EXAMPLE_GPUS=2 EXAMPLE_STEPS=10 timeout 300 bash cmake/scripts/gpu_check.sh "$OUT" examples > /tmp/examples.log 2>&1
echo "examples rc=$? at $SECONDS s"; grep -E "^\[rank0\]: step 10|failed|error" $OUT/examples.log | cut -c1-160
llama="$B/examples/llama/train_llama --preset tiny --precision bf16 --steps 60 --log-every 10 --eval-batches 1"
rm -f /tmp/llama.ckpt; timeout 60 $B/libddp/ddprun --nproc-per-node 2 --standalone $llama > $OUT/straight.log 2>&1; echo "straight rc=$?"
rm -f /tmp/llama.ckpt; timeout 90 $B/libddp/ddprun --nproc-per-node 2 --standalone --max-restarts 1 $llama \
  --checkpoint /tmp/llama.ckpt --checkpoint-every 20 --fail-at-step 30 --resume > $OUT/restart.log 2>&1; echo "restart rc=$?"
python3 - "$OUT" <<'PY'
import re, sys
def losses(f):
    d = {}
    for l in open(f):
        m = re.search(r"\[rank0\]: step (\d+)/\d+ \| loss ([0-9.]+)", l)
        if m: d[int(m.group(1))] = float(m.group(2))
    return d
a, b = losses(sys.argv[1] + "/straight.log"), losses(sys.argv[1] + "/restart.log")
print("straight", a); print("restart", b)
print("max |diff| over steps", sorted(a), max(abs(a[k] - b[k]) for k in a))
PY
grep -E "ddprun:|resumed|aborting" $OUT/restart.log | cut -c1-200
