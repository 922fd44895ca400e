#!/usr/bin/env bash
# For the call after next-float8-instructions.sh, on its warm machine (prepared in session 29, not run): the tree of
# float8-tile-fewer-instructions.patch (that call's patched copy, already built) against it with
# float8-tile-rows-per-input.patch, which gives the multi-input FP8 tiles (SwiGLU and its gradient) 128 rows: four
# 16-byte loads of each input in flight per thread, where the forward had four and the gradient six in all (ptxas,
# sm_90: 56-58 -> 80 registers, so 4 -> 3 blocks of 256 threads per SM; loads in flight per SM 64 -> 96 KiB
# forward, 96 -> 144 KiB gradient). The FP8 tests of the second, LLaMA-1.1B fp8 captured, alternating, two rounds,
# and the kernels' bandwidth. About 5 minutes (more on a fresh machine, which builds both trees).
set -u
: "${OUT:?}"
here=benchmarks/results/2026-11-29-h200-session29/scripts
bash benchmarks/scripts/ab_patch.sh $here/float8-tile-rows-per-input.patch \
  --base-patch $here/float8-tile-fewer-instructions.patch --tests Float8 --test-targets ddp_float8_gpu_tests --profile \
  --run "--model llama --steps 12 --warmup 4 --cuda-graph --precision fp8 --fp8-fast-accum" || exit 1
python3 $here/float8_kernel_bandwidth.py /tmp/ab-patched.json | tee "$OUT/float8-kernels-rows.txt"
