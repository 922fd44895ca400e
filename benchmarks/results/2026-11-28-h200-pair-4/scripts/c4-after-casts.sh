#!/usr/bin/env bash
# Session 25 call 4 (2 x H200, the session's last ~6 minutes): after 780a3d0, LLaMA-1.1B bf16 1 -> 2 GPUs (captured,
# ZeRO-2 with bf16 units at two, copy engines) for its efficiency, and one profiled fp8 replay at two GPUs against
# the plain one-GPU one (where the two-GPU step still loses its time).
set -u
: "${OUT:?}"
nvidia-smi -L
bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target scaling_bench ddprun > /tmp/build.log 2>&1
echo "build rc=$? at $SECONDS s"
B=build/gpu
lb() {  # lb NAME NPROC FLAGS...
  local name=$1 n=$2; shift 2
  (( SECONDS > 300 )) && { echo "$name skipped at $SECONDS s"; return; }
  timeout 45 $B/libddp/ddprun --nproc-per-node "$n" --standalone $B/benchmarks/scaling/scaling_bench \
    --json "$OUT/rows.jsonl" "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s $(tail -c 300 /tmp/run.log | grep -i error)"
}
l="--model llama --steps 12 --warmup 4 --cuda-graph"
c="$l --copy-engine-reductions --sharding gradients --param-dtype bf16"
lb bf16-1gpu 1 $l --precision bf16
lb bf16-2gpus 2 $c --precision bf16
lb fp8-2gpus-profiled 2 $c --precision fp8 --fp8-fast-accum --profile-trace /tmp/two.json
lb fp8-1gpu-profiled 1 $l --precision fp8 --fp8-fast-accum --profile-trace /tmp/one.json
ls /tmp/*.json
python3 benchmarks/scaling/kernel_diff.py --labels plain1,zero2x2 --top 24 --width 120 /tmp/one.json /tmp/two*.json \
  > "$OUT/diff-fp8-plain1-zero2x2.txt" 2>&1; head -c 3000 "$OUT/diff-fp8-plain1-zero2x2.txt"
python3 - "$OUT" <<'PY'
import json, sys
for r in (json.loads(l) for l in open(sys.argv[1] + "/rows.jsonl") if l.strip()):
    print(r.get("precision"), r.get("gpus"), r.get("sharding", "-"), round(r.get("throughput") or 0), r.get("step_ms"))
PY
