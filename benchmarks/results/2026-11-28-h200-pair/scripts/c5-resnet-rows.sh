#!/usr/bin/env bash
# Session 22 call 5 (2 GPUs, the last ~3.5 device minutes): ResNet-50 captured on the copy engines, 1 -> 2 GPUs,
# bf16 and tf32, at main e57ff05 (with the gradient-layout fix of 736d6e6).
set -u
: "${OUT:?}"
nvidia-smi -L
bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target scaling_bench ddprun > /tmp/build.log 2>&1; echo "build rc=$? at $SECONDS s"
B=build/gpu
lb() {  # lb NAME NPROC FLAGS...
  local name=$1 n=$2; shift 2
  timeout 40 $B/libddp/ddprun --nproc-per-node "$n" --standalone $B/benchmarks/scaling/scaling_bench \
    --json "$OUT/rows.jsonl" "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s $(tail -c 300 /tmp/run.log | grep -i error)"
}
for p in tf32 bf16; do
  r="--model resnet50 --precision $p --steps 20 --warmup 5 --cuda-graph --copy-engine-reductions"
  lb $p-1 1 $r
  lb $p-2 2 $r
done
python3 - "$OUT" <<'PY'
import json, sys
for r in map(json.loads, open(sys.argv[1] + "/rows.jsonl")):
    print(r["model"], r["precision"], r["gpus"], round(r["throughput"]), r.get("step_ms"))
PY
