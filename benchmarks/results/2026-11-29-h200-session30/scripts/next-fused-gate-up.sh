#!/usr/bin/env bash
# For the next one-GPU call (prepared in session 30, not run: no device time left). LLaMA's gate and up projections
# as one layer, w13 (fused-gate-up.patch, beside this script; LlamaConfig::fused_gate_up, default on, like
# fused_qkv): one GEMM each way instead of two, no bf16 sum of two input gradients, one weight cast, and the
# feed-forward norm writing w13's FP8 input itself (ddp::float8::add_rms_norm, which the shared cast of w1 and w3
# kept unfused). SwiGLU's example kernels read the halves in place and write the gradient whole. CPU-checked:
# Llama.OneProjectionIsItsLayersStacked (w13 = w1, w3 stacked: loss and every gradient), both builds. On the GPU:
# the LLaMA and FP8 tests of the patched tree (LlamaFusedOps.SwigluMatchesAten has the halves case), then
# LLaMA-1.1B captured fp8 and bf16, main against patched, alternating, two rounds, one profiled fp8 replay of each,
# and the FP8 kernels' bandwidth. About 9 minutes on a fresh machine.
set -u
: "${OUT:?}"
here=benchmarks/results/2026-11-29-h200-session30/scripts
nvidia-smi -L
bash benchmarks/scripts/ab_patch.sh $here/fused-gate-up.patch --tests "LlamaFused|Float8|RmsNorm" \
  --test-targets "ddp_llama_gpu_tests ddp_float8_gpu_tests ddp_rms_norm_gpu_tests" --profile \
  --run "--model llama --steps 12 --warmup 4 --cuda-graph --precision fp8 --fp8-fast-accum" \
  --run "--model llama --steps 12 --warmup 4 --cuda-graph --precision bf16" || exit 1
for trace in base patched; do
  echo "$trace:"; python3 benchmarks/results/2026-11-29-h200-session29/scripts/float8_kernel_bandwidth.py /tmp/ab-$trace.json
done > "$OUT/float8-kernels.txt" 2>&1
# The device returns at most eight files a call: the rows in one archive.
(cd "$OUT" && tar czf rows.tgz rows-*.jsonl && rm rows-*.jsonl)
