#!/usr/bin/env bash
# After callA (one GPU, its build/gpu reused): FusedAdamW writing the Float8Linear weights' FP8 casts and bf16
# copies (optimizer-weight-casts.patch, in this tree) against the tree without it, LLaMA-1.1B captured, fp8 with
# fast accumulation and bf16, two rounds alternating, one profiled fp8 replay each, and the FP8 kernels' bandwidth
# against the copy.
set -u
: "${OUT:?}"
here=benchmarks/results/2026-12-07-session35/scripts
export DDP_GIT_COMMIT=$1
nvidia-smi -L
bash benchmarks/scripts/ab_patch.sh $here/optimizer-weight-casts.patch --reverse --profile --rounds 2 \
  --run "--model llama --steps 12 --warmup 4 --cuda-graph --precision fp8 --fp8-fast-accum" \
  --run "--model llama --steps 12 --warmup 4 --cuda-graph --precision bf16" || exit 1
for trace in base patched; do
  echo "$trace:"; python3 benchmarks/results/2026-11-29-h200-session29/scripts/float8_kernel_bandwidth.py /tmp/ab-$trace.json
done > "$OUT/float8-kernels.txt" 2>&1
cat "$OUT/float8-kernels.txt"
grep -E "adamw|Identity|diff ms|span" "$OUT/diff.txt" | cut -c1-170
