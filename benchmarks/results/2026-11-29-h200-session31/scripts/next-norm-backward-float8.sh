#!/usr/bin/env bash
# For a next one-GPU call (prepared in session 31, not run: no device time left). norm-backward-float8.patch (beside
# this script): float8::add_rms_norm(x, delta, delta_layer, weight, layer) also takes the layer whose output delta
# is; its backward writes delta's gradient as that layer's E5M2 output gradient (the norm's backward kernel, now a
# template over how delta's gradient is written, rmsnorm/backward_kernel.cuh, with an FP8 writer; then a byte
# transpose, float8/transpose.cu), so the 44 bf16 casts of wo's and w2's output gradients in a LLaMA-1.1B step go
# (about 0.9 ms of casts for a transpose of half their traffic). The LLaMA example passes wo to the feed-forward
# norm and the previous w2 to the attention norm and the final norm. New tests
# Float8AddRmsNormDeltaGradient.IsTheCastTheDeltaLayerWouldMake (bit-equal gradients without a reader, close with
# one), .ADeltaThatIsNotTheLayersOutputIsRefused and .ALayerWithABiasGetsItsGradientInValues (a review's finding:
# a layer with a bias is never offered its output gradient, swiglu_linear's layers included, since the bias's add
# would sum the placeholder into the bias gradient). Before landing, also build and test the CPU configuration. The patched tree's FP8, RMSNorm and LLaMA GPU tests, then
# LLaMA-1.1B captured fp8 and bf16 (bf16: the refactored kernel must be no slower), main against patched, two
# rounds, one profiled fp8 replay each. About 8.5 minutes on a fresh machine.
set -u
: "${OUT:?}"
here=benchmarks/results/2026-11-29-h200-session31/scripts
nvidia-smi -L
bash benchmarks/scripts/ab_patch.sh $here/norm-backward-float8.patch --tests "Float8|RmsNorm|LlamaFused" \
  --test-targets "ddp_float8_gpu_tests ddp_rms_norm_gpu_tests ddp_llama_gpu_tests" --profile \
  --run "--model llama --steps 12 --warmup 4 --cuda-graph --precision fp8 --fp8-fast-accum" \
  --run "--model llama --steps 12 --warmup 4 --cuda-graph --precision bf16" || exit 1
for trace in base patched; do
  echo "$trace:"; python3 benchmarks/results/2026-11-29-h200-session29/scripts/float8_kernel_bandwidth.py /tmp/ab-$trace.json
done > "$OUT/float8-kernels.txt" 2>&1
(cd "$OUT" && tar czf rows.tgz rows-*.jsonl && rm rows-*.jsonl)
