#!/usr/bin/env bash
# Session 24 call 2 (2 x H200): build from scratch; the GPU tests of the fused gate/up projection (w13; the FP8 tile
# kernel's row strides); its A/B on one GPU (captured, bf16 and fp8, alternating, two rounds); libddp's rows at 1 and
# 2 GPUs with it; torch.compile's LLaMA bf16 row in the same lease.
set -u
: "${OUT:?}"
nvidia-smi -L
bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target scaling_bench ddprun ddp_float8_gpu_tests ddp_llama_gpu_tests > /tmp/build.log 2>&1
echo "build rc=$? at $SECONDS s"; grep -E "error" /tmp/build.log | head -5
timeout 150 ctest --test-dir build/gpu -R "Float8|LlamaFusedOps" -E "Float8ScalingState" --output-on-failure \
  > "$OUT/tests.log" 2>&1
echo "tests rc=$? at $SECONDS s"; grep -E "tests passed|Failed|exit code" "$OUT/tests.log" | head -12
grep -E "swiglu_halves|halves" "$OUT/tests.log" | head -8
B=build/gpu
lb() {  # lb NAME NPROC FLAGS...
  local name=$1 n=$2; shift 2
  timeout 60 $B/libddp/ddprun --nproc-per-node "$n" --standalone $B/benchmarks/scaling/scaling_bench \
    --json "$OUT/rows.jsonl" "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s $(grep -o '[0-9.]* tok/s' /tmp/run.log | tail -1) $(tail -c 300 /tmp/run.log | grep -i error)"
}
l="--model llama --steps 15 --warmup 6 --cuda-graph"
for round in 1 2; do
  lb bf16-fused 1 $l --precision bf16
  lb bf16-two-layers 1 $l --precision bf16 --unfuse gate-up
  lb fp8-fused 1 $l --precision fp8 --fp8-fast-accum
  lb fp8-two-layers 1 $l --precision fp8 --fp8-fast-accum --unfuse gate-up
done
c="$l --copy-engine-reductions --sharding gradients --param-dtype bf16"
lb bf16-2gpus 2 $c --precision bf16
lb fp8-2gpus 2 $c --precision fp8 --fp8-fast-accum
timeout $((585 - SECONDS)) python3 benchmarks/scaling/run_scaling.py --build $B --gpus 1 --steps 15 --warmup 5 \
  --out "$OUT" --prefix llama-compile --models llama --precisions bf16 --impls pytorch-compile > "$OUT/compile.log" 2>&1
echo "compile rc=$? at $SECONDS s"
python3 - "$OUT" <<'PY'
import glob, json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/rows.jsonl") if l.strip()]
for path in glob.glob(sys.argv[1] + "/llama-compile.json"):
    rows += json.load(open(path))["rows"]
for r in rows:
    print(r.get("impl", "libddp"), r.get("precision"), r.get("gpus"), r.get("sharding", "-"), r.get("unfuse", ""),
          round(r.get("throughput") or 0), r.get("step_ms"), str(r.get("error", ""))[:100])
PY
