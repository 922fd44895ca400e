#!/usr/bin/env bash
# For the call after float8-feeds.patch has landed (prepared in session 32; one H200, about 9 minutes): issue 29's
# proof for the new fused paths, on main as it then is. (1) 300-step curves of the tiny LLaMA, fused (the
# feed-forward norm writing gate's and up's FP8 input, the q/k/v split writing wqkv's FP8 output gradient, the
# norm backward's new grid) against --unfused, same seed, and seed 1 for the noise, fp8 and bf16; (2) run_scaling
# side by side on one GPU: LLaMA-1.1B bf16 libddp captured against torch.compile, fp8 libddp captured; (3)
# LLaMA-2-7B bf16 batch 1 captured, with expandable segments (session 32 call 4: it records only so).
set -u
: "${OUT:?}"
SECONDS=0
nvidia-smi -L
{ bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 &&
  cmake --build build/gpu --target scaling_bench ddprun train_llama; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "build at $SECONDS s"
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
left=$((570 - SECONDS))
if [[ $left -gt 110 ]]; then
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout $left $ddprun --nproc-per-node 1 --standalone \
    build/gpu/benchmarks/scaling/scaling_bench --model llama --preset llama2-7b --batch 1 --precision bf16 \
    --cuda-graph --steps 8 --warmup 3 --json "$OUT/llama2-7b.jsonl" > /tmp/7b.log 2>&1
  echo "llama2-7b captured rc=$? at $SECONDS s"; tail -3 /tmp/7b.log
fi
(cd /tmp && tar czf "$OUT/logs.tgz" bf16.log fp8.log 7b.log build.log 2>/dev/null)
rm -f "$OUT"/*.svg
