#!/usr/bin/env bash
# Session 24 call 1 (2 x H200, main 0690c06): build from scratch; the GPU tests of session 23's review fixes (FP8
# checkpoint state, fused q/k/v checks); LLaMA-1.1B fp8 captured replays profiled (plain on 1 GPU, ZeRO-2 with bf16
# units on 2, plain with bf16 reduction on 2) to find what the 2-GPU step adds; LLaMA bf16 1 -> 2, libddp against
# PyTorch eager DDP in one run.
set -u
: "${OUT:?}"
nvidia-smi -L
bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target scaling_bench ddprun ddp_sharding_gpu_tests ddp_llama_gpu_tests ddp_example_gpu_tests \
  ddp_unit_tests train_llama train_resnet50 > /tmp/build.log 2>&1
echo "build rc=$? at $SECONDS s"; grep -E "error" /tmp/build.log | head -5
timeout 170 ctest --test-dir build/gpu -R "ShardingCuda|LlamaFusedOps|Fp8LlamaRun|Float8ScalingState" --output-on-failure \
  > "$OUT/tests.log" 2>&1
echo "tests rc=$? at $SECONDS s"; grep -E "tests passed|Passed|Failed|Skipped|exit code" "$OUT/tests.log" | head -24
B=build/gpu
lb() {  # lb NAME NPROC FLAGS...
  local name=$1 n=$2; shift 2
  timeout 75 $B/libddp/ddprun --nproc-per-node "$n" --standalone $B/benchmarks/scaling/scaling_bench \
    --json "$OUT/rows.jsonl" "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s $(tail -c 300 /tmp/run.log | grep -i error)"
}
f="--model llama --precision fp8 --fp8-fast-accum --steps 12 --warmup 4 --cuda-graph --copy-engine-reductions"
lb fp8-1-plain 1 $f --profile-trace /tmp/fp8-1.json
lb fp8-2-zero2-bf16 2 $f --sharding gradients --param-dtype bf16 --profile-trace /tmp/fp8-2-zero2.json
lb fp8-2-plain-bf16-reduce 2 $f --reduce-dtype bf16 --profile-trace /tmp/fp8-2-plain.json
kd() { python3 benchmarks/scaling/kernel_diff.py --top 24 --width 120 "$@"; }
kd --labels plain1,zero2x2 /tmp/fp8-1.json /tmp/fp8-2-zero2.json > "$OUT/diff-fp8-plain1-zero2x2.txt" 2>&1
kd --labels plain1,plainx2 /tmp/fp8-1.json /tmp/fp8-2-plain.json > "$OUT/diff-fp8-plain1-plainx2.txt" 2>&1
head -c 1800 "$OUT/diff-fp8-plain1-zero2x2.txt"
timeout $((590 - SECONDS)) python3 benchmarks/scaling/run_scaling.py --build $B --steps 15 --warmup 5 --out "$OUT" \
  --prefix llama-bf16 --gpus 1,2 --models llama --precisions bf16 --impls libddp-graph,pytorch \
  --sharding gradients --param-dtype bf16 --copy-engine-reductions > "$OUT/llama-bf16.log" 2>&1
echo "llama bf16 rc=$? at $SECONDS s"
python3 - "$OUT" <<'PY'
import glob, json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/rows.jsonl") if l.strip()]
for path in glob.glob(sys.argv[1] + "/llama-bf16.json"):
    rows += json.load(open(path))["rows"]
for r in rows:
    print(r.get("impl", "libddp"), r.get("precision"), r.get("gpus"), r.get("sharding", "-"), r.get("param_dtype"),
          round(r.get("throughput") or 0), r.get("step_ms"), str(r.get("error", ""))[:100])
PY
