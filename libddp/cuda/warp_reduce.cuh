#pragma once

// Reductions across the 32 lanes of a warp, the first step of every block
// reduction in libddp's kernels. Every lane gets the result.

namespace ddp::detail {

__device__ __forceinline__ int warp_max(int value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) value = max(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

__device__ __forceinline__ float warp_sum(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

}  // namespace ddp::detail
