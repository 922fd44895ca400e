#!/usr/bin/env bash
# Session 26 call 3 (2 x H200): bucket size for LLaMA-1.1B at two GPUs (captured, ZeRO-2 with bf16 units, copy
# engines): 25 (default), 50 and 100 MiB, fp8 and bf16, alternating, two rounds; one-GPU plain rows of each
# precision first for the efficiency. Fewer buckets mean fewer sum kernels, flag waits and joins of the graph's
# branches (call 1 counted 300 more idle stretches than one GPU). About 7 minutes.
set -u
: "${OUT:?}"
nvidia-smi -L
bash cmake/scripts/configure.sh python build/gpu -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target scaling_bench ddprun > /tmp/build.log 2>&1
echo "build rc=$? at $SECONDS s"
B=build/gpu
lb() {  # lb NAME NPROC FLAGS...
  local name=$1 n=$2; shift 2
  (( SECONDS > 540 )) && { echo "$name skipped at $SECONDS s"; return; }
  rm -f /tmp/row.jsonl
  timeout 45 $B/libddp/ddprun --nproc-per-node "$n" --standalone $B/benchmarks/scaling/scaling_bench \
    --json /tmp/row.jsonl "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s $(tail -c 300 /tmp/run.log | grep -i error)"
  [[ -f /tmp/row.jsonl ]] && sed "s/^{/{\"label\": \"$name\", /" /tmp/row.jsonl >> "$OUT/rows.jsonl"
}
l="--model llama --steps 12 --warmup 4 --cuda-graph"
c="$l --copy-engine-reductions --sharding gradients --param-dtype bf16"
lb fp8-1gpu 1 $l --precision fp8 --fp8-fast-accum
lb bf16-1gpu 1 $l --precision bf16
for round in 1 2; do
  for precision in "fp8 --fp8-fast-accum" "bf16"; do
    for cap in 25 50 100; do
      lb "${precision%% *}-cap$cap-$round" 2 $c --precision $precision --bucket-cap-mb $cap
    done
  done
done
python3 -c 'import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r["label"], round(r["throughput"]), r["step_ms"])' "$OUT/rows.jsonl"
