#!/usr/bin/env bash
# For the call after next-float8-feeds.sh (prepared in session 32; one H200, about 8 minutes), on main with
# float8-feeds.patch applied in the working tree, before it lands: issue 29's proof for the new fused paths.
# (0) The examples' LLaMA GPU tests (an FP8 run killed and resumed exactly, the captured step against the eager
# one), which next-float8-feeds.sh leaves out; (1) 300-step curves of the tiny LLaMA, fused (the feed-forward norm
# writing gate's and up's FP8 input, the q/k/v split writing wqkv's FP8 output gradient, the norm backward's new
# grid) against --unfused, same seed, and seed 1 for the noise, fp8 and bf16; (2) run_scaling side by side on one
# GPU: LLaMA-1.1B bf16 libddp captured against torch.compile, fp8 libddp captured.
set -u
: "${OUT:?}"
SECONDS=0
nvidia-smi -L
{ bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 &&
  cmake --build build/gpu --target scaling_bench ddprun train_llama ddp_example_gpu_tests; } > /tmp/build.log 2>&1 ||
  { tail -30 /tmp/build.log; exit 1; }
echo "build at $SECONDS s"
timeout 150 ctest --test-dir build/gpu -R "ExamplesGpu.*Llama" --output-on-failure > "$OUT/examples-llama.log" 2>&1
echo "ExamplesGpu LLaMA tests rc=$? at $SECONDS s: $(grep -E "tests passed" "$OUT/examples-llama.log")"
ddprun=build/gpu/libddp/ddprun
mkdir -p /tmp/curves
small="--preset tiny --dim 256 --layers 4 --heads 4 --kv-heads 2 --ffn 704 --vocab 512 --seq-len 256 --batch 16
  --steps 300 --log-every 25"
for run in "fp8-fused --precision fp8 --fp8-fast-accum" "fp8-unfused --precision fp8 --fp8-fast-accum --unfused" \
  "fp8-fused-seed1 --precision fp8 --fp8-fast-accum --seed 1" "bf16-fused --precision bf16" \
  "bf16-unfused --precision bf16 --unfused"; do
  name=${run%% *}
  # shellcheck disable=SC2086  # flags are words
  timeout 90 $ddprun --nproc-per-node 1 --standalone build/gpu/examples/llama/train_llama $small \
    --metrics "/tmp/curves/$name.jsonl" ${run#* } > "/tmp/curves/$name.log" 2>&1
  echo "curve $name rc=$? at $SECONDS s: $(grep -o 'validation loss [0-9.]*' "/tmp/curves/$name.log" | tail -1)"
done
(cd /tmp/curves && tar czf "$OUT/curves.tgz" ./*)
common="--build build/gpu --out $OUT --gpus 1 --models llama --steps 20 --warmup 5"
timeout 230 python3 benchmarks/scaling/run_scaling.py $common --prefix side-by-side-bf16 --precisions bf16 \
  --impls libddp-graph,pytorch-compile > /tmp/bf16.log 2>&1
echo "run_scaling bf16 rc=$? at $SECONDS s"
timeout 60 python3 benchmarks/scaling/run_scaling.py $common --prefix side-by-side-fp8 --precisions fp8 \
  --fp8-fast-accum --impls libddp-graph > /tmp/fp8.log 2>&1
echo "run_scaling fp8 rc=$? at $SECONDS s"
(cd /tmp && tar czf "$OUT/logs.tgz" bf16.log fp8.log build.log 2>/dev/null)
rm -f "$OUT"/*.svg
