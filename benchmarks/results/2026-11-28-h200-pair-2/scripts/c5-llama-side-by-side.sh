#!/usr/bin/env bash
# Session 23 call 5 (the same H200 as call 4, warm): LLaMA-1.1B with the fused q/k/v projection, libddp captured
# against torch.compile in one lease (bf16), and libddp fp8 with fast accumulation.
set -u
: "${OUT:?}"
nvidia-smi -L
cmake --build build/gpu --target scaling_bench ddprun > /tmp/build.log 2>&1; echo "build rc=$? at $SECONDS s"
rs() {  # rs NAME SECONDS ARGS...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 benchmarks/scaling/run_scaling.py --build build/gpu --gpus 1 --steps 15 --warmup 5 \
    --out "$OUT" --prefix "$name" --models llama "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? at $SECONDS s"
}
rs llama-fp8 70 --precisions fp8 --fp8-fast-accum --impls libddp-graph
rs llama-bf16 $((380 - SECONDS)) --precisions bf16 --impls libddp-graph,pytorch-compile
python3 - "$OUT" <<'PY'
import glob, json, sys
rows = []
for path in sorted(glob.glob(sys.argv[1] + "/*.json")):
    rows += json.load(open(path))["rows"]
for path in sorted(glob.glob(sys.argv[1] + "/*.rows.jsonl")):
    rows += [json.loads(line) for line in open(path) if line.strip()]
for r in rows:
    print(r.get("impl"), r.get("model"), r.get("precision"), r.get("gpus"), round(r.get("throughput") or 0),
          r.get("step_ms"), str(r.get("error", ""))[:100])
PY
