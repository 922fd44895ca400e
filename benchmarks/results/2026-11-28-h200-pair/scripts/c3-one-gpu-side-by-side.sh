#!/usr/bin/env bash
# Session 22 call 3 (warm 2 x H200, one GPU used): side by side in one lease, LLaMA-1.1B bf16 and fp8 (libddp
# captured) against torch.compile, ResNet-50 bf16 libddp captured against torch.compile and its CUDA-graph mode.
set -u
: "${OUT:?}"
nvidia-smi -L
rs() {  # rs NAME SECONDS ARGS...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 benchmarks/scaling/run_scaling.py --gpus 1 --steps 10 --warmup 3 --out "$OUT" --prefix "$name" \
    "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? at $SECONDS s"; grep -E "tok/s|img/s|rror" "$OUT/$name.log" | grep -v "^run_scaling: .*: /" | cut -c1-170
}
rs llama-libddp 80 --models llama --precisions bf16 --impls libddp-graph
rs llama-fp8 80 --models llama --precisions fp8 --fp8-fast-accum --impls libddp-graph
rs resnet 200 --models resnet50 --precisions bf16 --impls libddp-graph,pytorch-compile,pytorch-compile-graphs
rs llama-compile $((470 - SECONDS)) --models llama --precisions bf16 --impls pytorch-compile,libddp-graph
cat "$OUT"/*.jsonl 2>/dev/null | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l); print(r.get("impl"), r["model"], r["precision"], r["gpus"], round(r["throughput"]), r.get("step_ms"))'
