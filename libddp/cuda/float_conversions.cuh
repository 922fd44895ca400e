#pragma once

// Conversions between the activations' dtypes (fp32, bf16, fp16) and the fp32
// every libddp kernel computes in, rounding to nearest even on the way back:
// what the BatchNorm and FP8 kernels share.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace ddp::detail {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

}  // namespace ddp::detail
