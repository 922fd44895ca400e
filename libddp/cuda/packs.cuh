#pragma once

// Packs of consecutive elements moved as one access (and, from
// alignment.h, whether a pointer may take them), their conversion to and
// from the fp32 the kernels compute in, and the dispatch from an ATen dtype
// to its CUDA type: what the BatchNorm, RMSNorm and FP8 norm kernels share.

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/alignment.h"
#include "cuda/float_conversions.cuh"

namespace ddp::detail {

/// N consecutive elements, loaded and stored together: aligned to their
/// size up to 16 bytes (the widest access; a wider pack moves as several).
template <typename T, int N>
struct alignas(sizeof(T) * N < 16 ? sizeof(T) * N : 16) Pack {
  T v[N];
};

/// The N elements at `source` (aligned as Pack<T, N>) as floats.
template <typename T, int N>
__device__ __forceinline__ void load_as_floats(const T* source, float (&values)[N]) {
  const Pack<T, N> pack = *reinterpret_cast<const Pack<T, N>*>(source);
#pragma unroll
  for (int i = 0; i < N; ++i) values[i] = to_float(pack.v[i]);
}

/// `values` rounded to T and stored as one pack at `destination`.
template <typename T, int N>
__device__ __forceinline__ void store_from_floats(T* destination, const float (&values)[N]) {
  Pack<T, N> pack;
#pragma unroll
  for (int i = 0; i < N; ++i) pack.v[i] = from_float<T>(values[i]);
  *reinterpret_cast<Pack<T, N>*>(destination) = pack;
}

/// Calls f(static_cast<T*>(nullptr)) with T the CUDA type of `dtype`: fp32,
/// bf16 or fp16 (the pointer only carries the type); any other dtype is an
/// error that `what` starts.
template <typename F>
void with_cuda_type(c10::ScalarType dtype, const char* what, F&& f) {
  if (dtype == c10::kFloat) {
    f(static_cast<float*>(nullptr));
  } else if (dtype == c10::kBFloat16) {
    f(static_cast<__nv_bfloat16*>(nullptr));
  } else {
    TORCH_CHECK(dtype == c10::kHalf, what, ": fp32, bf16 or fp16 expected, got ", dtype);
    f(static_cast<__half*>(nullptr));
  }
}

/// Calls f(In*, Out*), null pointers as with_cuda_type's, with the CUDA
/// types of an input dtype `in` and an output dtype `out`.
template <typename F>
void with_cuda_types(c10::ScalarType in, c10::ScalarType out, const char* what, F&& f) {
  with_cuda_type(in, what,
                 [&](auto* in_type) { with_cuda_type(out, what, [&](auto* out_type) { f(in_type, out_type); }); });
}

}  // namespace ddp::detail
