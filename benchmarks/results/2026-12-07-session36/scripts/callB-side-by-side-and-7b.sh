#!/usr/bin/env bash
# Right after callA (same warm machine, its build/gpu reused), with the weight casts in the tree: issue 29's rows.
# (1) run_scaling side by side on one GPU: LLaMA-1.1B bf16, libddp captured against torch.compile; fp8 (fast
# accumulation) libddp captured. (2) The LLaMA-2-7B preset, batch 1, captured, bf16 and fp8, libddp alone (the
# 7B only fits one H200: 16 bytes per parameter).
set -u
: "${OUT:?}"
SECONDS=0
export DDP_GIT_COMMIT=$1
nvidia-smi -L
cmake --build build/gpu --target scaling_bench ddprun > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
common="--build build/gpu --out $OUT --gpus 1 --models llama --steps 20 --warmup 5"
timeout 240 python3 benchmarks/scaling/run_scaling.py $common --prefix side-by-side-bf16 --precisions bf16 \
  --impls libddp-graph,pytorch-compile > "$OUT/bf16.log" 2>&1
echo "run_scaling bf16 rc=$? at $SECONDS s"
timeout 70 python3 benchmarks/scaling/run_scaling.py $common --prefix side-by-side-fp8 --precisions fp8 \
  --fp8-fast-accum --impls libddp-graph > "$OUT/fp8.log" 2>&1
echo "run_scaling fp8 rc=$? at $SECONDS s"
grep -hE "tok/s|MFU" "$OUT"/side-by-side-*.md | head -20
if nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | awk '{exit !($1 > 120000)}'; then
  for precision in "bf16" "fp8 --fp8-fast-accum"; do
    (( SECONDS < 480 )) || { echo "no time left for 7B $precision"; continue; }
    # shellcheck disable=SC2086  # flags are words
    # The eager steps' segments strand memory the recording needs without expandable segments (session 32).
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout $((590 - SECONDS)) build/gpu/libddp/ddprun --nproc-per-node 1 --standalone \
      build/gpu/benchmarks/scaling/scaling_bench --model llama --preset llama2-7b --batch 1 --steps 8 --warmup 3 \
      --cuda-graph --precision $precision > "$OUT/7b-${precision%% *}.log" 2>&1
    echo "7B $precision rc=$? at $SECONDS s"; tail -4 "$OUT/7b-${precision%% *}.log"
  done
else
  echo "7B: this GPU has under 120 GiB; the 7B preset needs one H200"
fi
rm -f "$OUT"/*.svg
echo "done at $SECONDS s"
