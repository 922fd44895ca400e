#!/usr/bin/env bash
# Session 22 call 2 (warm 2 x H200 after next-two-gpus.sh): LLaMA-2-7B bf16, batch 1, on 2 GPUs in every sharding
# mode, fp32 parameters, then ZeRO-3 with bf16 units: peak memory per rank (uncapped: an H200 holds 139 GiB), tok/s.
set -u
: "${OUT:?}"
nvidia-smi -L
B=build/gpu
[[ -x $B/benchmarks/scaling/scaling_bench ]] || { timeout 200 bash cmake/scripts/gpu_check.sh "$OUT" none > /tmp/gpu_check.log 2>&1; echo "build rc=$?"; }
lb() {  # lb NAME NPROC FLAGS...
  local name=$1 n=$2; shift 2
  timeout 110 $B/libddp/ddprun --nproc-per-node "$n" --standalone $B/benchmarks/scaling/scaling_bench \
    --json "$OUT/rows.jsonl" "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s $(tail -c 400 /tmp/run.log | grep -i error)"
}
s="--model llama --preset llama2-7b --batch 1 --precision bf16 --steps 6 --warmup 2 --copy-engine-reductions"
for mode in full gradients optimizer none; do lb 7b-$mode 2 $s --sharding $mode; done
lb 7b-full-bf16-units 2 $s --sharding full --param-dtype bf16
python3 - "$OUT" <<'PY'
import json, sys
for r in map(json.loads, open(sys.argv[1] + "/rows.jsonl")):
    print(r["model"], r["precision"], r["gpus"], r.get("sharding", "-"), r.get("param_dtype"), round(r["throughput"]),
          r.get("step_ms"), "peak GiB", r.get("peak_mem_gib"), "exposed", r.get("exposed_comm_ms"))
PY
