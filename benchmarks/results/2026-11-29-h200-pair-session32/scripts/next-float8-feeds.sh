#!/usr/bin/env bash
# For the next device call (prepared in session 32, not run: no device time left; one H200 is enough). One patch,
# float8-feeds.patch (beside this script), four changes whose effects the kernel diff tells apart:
#  1. RMSNorm's backward kernel loads grad_sum's packs with x's and g's, before the block's sum, so that a row waits
#     for memory once (session 32 call 2: 44 x 76.8 us a step, 0.79 of the copy, a second wait after the sum);
#  2. its grid is the blocks that fit at once (cudaOccupancyMaxActiveBlocksPerMultiprocessor), not 8 per SM: the
#     kernel that keeps a 2048-wide row in registers uses 64-72 registers, so 3-4 blocks fit; the rest ran as a
#     second wave and added rows to weight_partials, whose ATen sum took 45 x 10.6 us;
#  3. the feed-forward norm writes the FP8 input that SwiGLU's gate and up share (float8::share_input_cast): the
#     group takes the norm's cast in either order (SharedInputCast::expect); 22 bf16 E4M3 casts (0.45 ms) go;
#  4. the q/k/v split's backward writes wqkv's FP8 output gradient itself through the new public hook
#     float8::output_gradient_destination / output_gradient_written (LLaMA's merge_rotate_qkv_to_float8): the 22
#     bf16 E5M2 casts (0.55 ms) become 22 byte transposes.
# Also in it (the final re-read of session 32): the two copies of the FP8 norm kernels' block amax reduction in
# float8/rms_norm.cu as one accumulate_block_amax (the forward kernels' SASS unchanged; the backward's FP8 writer now
# loops over a constant 8 warps instead of blockDim.x / 32, 88 fewer instructions, equal as launched).
# The patched tree's FP8, RMSNorm and LLaMA kernel GPU tests (new: Float8RmsNormSharedCast.*, RmsNormGpu at 4096 and
# 1030 columns, LlamaFusedOps.SplitRotateQkvWritesTheProjectionsFloat8GradientAsItsCastWould; the examples' LLaMA
# runs are left to next-curves-and-side-by-side.sh, which would not fit in this call's ten minutes),
# then LLaMA-1.1B captured fp8 and bf16, main against patched, two rounds, one profiled fp8 replay each. Land what
# the kernel diff and the rounds show winning (each part can be cut out of the patch by its files: 1-2
# libddp/rmsnorm/backward_kernel.cuh, 3 input_sharing/rms_norm_linear/linear.cpp and llama_model.cpp's two
# reader lines, 4 output_gradient.cpp and examples/llama/fused_*). About 8.5 minutes on a fresh machine.
set -u
: "${OUT:?}"
here=benchmarks/results/2026-11-29-h200-pair-session32/scripts
nvidia-smi -L
bash benchmarks/scripts/ab_patch.sh $here/float8-feeds.patch --tests "Float8|RmsNorm|LlamaFused" \
  --test-targets "ddp_float8_gpu_tests ddp_rms_norm_gpu_tests ddp_llama_gpu_tests" --profile \
  --run "--model llama --steps 12 --warmup 4 --cuda-graph --precision fp8 --fp8-fast-accum" \
  --run "--model llama --steps 12 --warmup 4 --cuda-graph --precision bf16" || exit 1
for trace in base patched; do
  echo "$trace:"; python3 benchmarks/results/2026-11-29-h200-session29/scripts/float8_kernel_bandwidth.py /tmp/ab-$trace.json
done > "$OUT/float8-kernels.txt" 2>&1
grep -E "rms_norm|reduce_kernel|Identity|transpose|qkv_rotation|diff ms" "$OUT/diff.txt" | cut -c1-160
