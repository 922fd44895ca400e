#!/usr/bin/env bash
# For a next one-GPU call (prepared in session 30, not run: no device time left). A review's findings on the
# norm-to-FP8 kernel (norm-float8-review-fixes.patch, beside this script): a misaligned fp32 weight (a slice, a
# parameter in a flat buffer) made float8::rms_norm throw where ddp::rms_norm runs, now it reads an aligned copy
# and the kernel asks 16-byte alignment, not 32; h is a tensor of its own, not a view made inside the function;
# a layer of another width is not offered a cast it would refuse; the shared strip's row stride 2 mod 8 words
# (the transposing reads 2-way instead of 4-way bank conflicts); the dynamic shared memory attribute set to the
# device's whole opt-in (no race between widths); dtype checks at the kernel's entry. New test
# Float8RmsNormBytes.EqualTheCastOfTheUnfusedNorm: the FP8 bytes against the cast of ddp::rms_norm's output at 2048
# and 7168 columns (66 and 224 KiB of shared memory), 8192 falling back. The FP8 tests of the patched tree, then
# LLaMA-1.1B fp8 captured, main against patched, two rounds, one profiled replay each (the norm kernel's time in
# diff.txt). About 7 minutes on a fresh machine.
set -u
: "${OUT:?}"
here=benchmarks/results/2026-11-29-h200-session30/scripts
nvidia-smi -L
bash benchmarks/scripts/ab_patch.sh $here/norm-float8-review-fixes.patch --tests "Float8|RmsNorm" \
  --test-targets "ddp_float8_gpu_tests ddp_rms_norm_gpu_tests" --profile \
  --run "--model llama --steps 12 --warmup 4 --cuda-graph --precision fp8 --fp8-fast-accum" || exit 1
(cd "$OUT" && tar czf rows.tgz rows-*.jsonl && rm rows-*.jsonl)
