#!/usr/bin/env bash
# Call 3 (one GPU): the FP8 tile kernels with 16-bit inputs always take four passes of rows (128-row tiles, so
# SwiGLU's forward cast keeps 8 loads of 16 bytes in flight per thread instead of 4; its gradients' 12 instead of
# 6), swiglu-tile-rows.patch, against this tree: the FP8 GPU tests, then LLaMA-1.1B captured fp8, two rounds, one
# profiled replay each, and each FP8 kernel's bandwidth against the copy.
set -u
: "${OUT:?}"
here=benchmarks/results/2026-12-07-session35/scripts
export DDP_GIT_COMMIT=$1
nvidia-smi -L
bash benchmarks/scripts/ab_patch.sh $here/swiglu-tile-rows.patch --profile --rounds 2 --tests "Float8" \
  --test-targets "ddp_float8_gpu_tests" \
  --run "--model llama --steps 12 --warmup 4 --cuda-graph --precision fp8 --fp8-fast-accum" || exit 1
for trace in base patched; do
  echo "$trace:"; python3 benchmarks/results/2026-11-29-h200-session29/scripts/float8_kernel_bandwidth.py /tmp/ab-$trace.json
done > "$OUT/float8-kernels.txt" 2>&1
cat "$OUT/float8-kernels.txt"
grep -E "float8_tile|diff ms|span" "$OUT/diff.txt" | cut -c1-170
