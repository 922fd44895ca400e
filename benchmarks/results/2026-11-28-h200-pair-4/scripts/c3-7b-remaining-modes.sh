#!/usr/bin/env bash
# Session 25 call 3 (2 x H200): the LLaMA-2-7B rows session 22 left out (2026-11-28-h200-pair.md, call 2): kNone
# (overran 110 s there; 200 s here) and ZeRO-1/2 with bf16 units; bf16, batch 1 x 4,096, copy-engine reductions,
# peak memory per rank uncapped (an H200 holds 139 GiB). The log tail of each run comes back.
set -u
: "${OUT:?}"
nvidia-smi -L
bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target scaling_bench ddprun > /tmp/build.log 2>&1
echo "build rc=$? at $SECONDS s"; grep -E "error" /tmp/build.log | head -5
B=build/gpu
lb() {  # lb NAME SECONDS FLAGS...
  local name=$1 limit=$2; shift 2
  timeout "$limit" $B/libddp/ddprun --nproc-per-node 2 --standalone $B/benchmarks/scaling/scaling_bench \
    --json "$OUT/rows.jsonl" "$@" > "/tmp/$name.log" 2>&1
  echo "$name rc=$? at $SECONDS s"
  { echo "== $name"; tail -c 1500 "/tmp/$name.log"; } >> "$OUT/run-tails.log"
}
s="--model llama --preset llama2-7b --batch 1 --precision bf16 --steps 6 --warmup 2 --copy-engine-reductions"
lb 7b-none 230 $s --sharding none
lb 7b-gradients-bf16-units 120 $s --sharding gradients --param-dtype bf16
lb 7b-optimizer-bf16-units $((585 - SECONDS)) $s --sharding optimizer --param-dtype bf16
python3 - "$OUT" <<'PY'
import json, sys
for r in (json.loads(l) for l in open(sys.argv[1] + "/rows.jsonl") if l.strip()):
    print(r["model"], r["precision"], r["gpus"], r.get("sharding", "-"), r.get("param_dtype"), round(r["throughput"]),
          r.get("step_ms"), "peak GiB", r.get("peak_mem_gib"), "exposed", r.get("exposed_comm_ms"))
PY
