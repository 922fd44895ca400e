#!/usr/bin/env bash
# Session 23 call 1 (2 x H200): SDPA backends at TinyLlama's attention shape; ResNet-50 tf32 and bf16, 1 -> 2 GPUs,
# libddp captured on the copy engines against PyTorch eager DDP, then torch.compile + DDP (bf16) with the time left.
set -u
: "${OUT:?}"
nvidia-smi -L
python3 benchmarks/results/2026-11-28-h200-pair-2/scripts/sdpa-backends.py 2>&1 | grep -v Warning
bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target scaling_bench ddprun > /tmp/build.log 2>&1; echo "build rc=$? at $SECONDS s"
rs() {  # rs NAME SECONDS ARGS...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 benchmarks/scaling/run_scaling.py --build build/gpu --steps 20 --warmup 5 --out "$OUT" \
    --prefix "$name" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? at $SECONDS s"; grep -E "rror" "$OUT/$name.log" | grep -v "^run_scaling: .*: /" | cut -c1-170
}
rs resnet-eager 330 --gpus 1,2 --models resnet50 --precisions tf32,bf16 --impls libddp-graph,pytorch --copy-engine-reductions
rs resnet-compile $((585 - SECONDS)) --gpus 1,2 --models resnet50 --precisions bf16 --impls pytorch-compile
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
