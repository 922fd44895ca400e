#!/usr/bin/env bash
# Session 31, call 2: the norm-to-FP8 review fixes (norm-float8-review-fixes.patch, with call 1's two faults fixed:
# the shared-memory attribute less the kernel's 32 static bytes; add_rms_norm's sum passed to the kernel as rows)
# as the base, LLaMA's gate and up as one layer (fused-gate-up.patch, session 30's) on top. The patched tree's
# LLaMA, FP8 and RMSNorm GPU tests (both patches' tests), then LLaMA-1.1B captured fp8 and bf16, base against
# patched, alternating, two rounds, one profiled fp8 replay each, and the FP8 kernels' bandwidth.
set -u
: "${OUT:?}"
here=benchmarks/results/2026-11-29-h200-session31/scripts
nvidia-smi -L
bash benchmarks/scripts/ab_patch.sh $here/fused-gate-up.patch --base-patch $here/norm-float8-review-fixes.patch \
  --tests "LlamaFused|Float8|RmsNorm" \
  --test-targets "ddp_llama_gpu_tests ddp_float8_gpu_tests ddp_rms_norm_gpu_tests" --profile \
  --run "--model llama --steps 12 --warmup 4 --cuda-graph --precision fp8 --fp8-fast-accum" \
  --run "--model llama --steps 12 --warmup 4 --cuda-graph --precision bf16" || exit 1
for trace in base patched; do
  echo "$trace:"; python3 benchmarks/results/2026-11-29-h200-session29/scripts/float8_kernel_bandwidth.py /tmp/ab-$trace.json
done > "$OUT/float8-kernels.txt" 2>&1
# The device returns at most eight files a call: the rows in one archive.
(cd "$OUT" && tar czf rows.tgz rows-*.jsonl && rm rows-*.jsonl)
