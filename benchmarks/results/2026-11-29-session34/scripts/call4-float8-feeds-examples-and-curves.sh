#!/usr/bin/env bash
# Session 34 call 4 (one H200): the float8-feeds patch (committed on the s34 branch) through the examples' LLaMA GPU
# tests and the 300-step curves, fused against --unfused; next-curves-and-side-by-side.sh without its side-by-side
# run_scaling (no device time left for torch.compile).
set -u
: "${OUT:?}"
SECONDS=0
nvidia-smi -L
{ bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 &&
  cmake --build build/gpu --target ddprun train_llama ddp_example_gpu_tests; } > /tmp/build.log 2>&1 ||
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
