#pragma once

// What the examples' CUDA kernels (LLaMA's fused layers, ResNet-50's max
// pooling) share: fp32 from and to the activations' dtypes, rounding to
// nearest even as ATen's conversions do, and packs of consecutive elements
// moved as one 16-byte (or smaller) access, and the dispatch from an ATen
// dtype to the CUDA type and the widest pack the data allow.

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace examples::cuda {

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

/// N consecutive elements, loaded and stored as one access (N * sizeof(T) bytes).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <typename T>
struct Type {
  using type = T;
};

/// Calls f(Type<T>{}) with T the CUDA type of `dtype`: fp32, bf16 or fp16.
template <typename F>
void with_cuda_type(c10::ScalarType dtype, const char* what, F&& f) {
  switch (dtype) {
    case c10::kFloat: return f(Type<float>{});
    case c10::kBFloat16: return f(Type<__nv_bfloat16>{});
    case c10::kHalf: return f(Type<__half>{});
    default: TORCH_CHECK(false, what, ": fp32, bf16 or fp16 expected, got ", dtype);
  }
}

/// Calls f(Type<T>{}, pack) with T the CUDA type of `dtype` and pack 16
/// bytes of T where rows of `row_elements` and every one of `pointers` allow
/// 16-byte accesses, else 1.
template <typename F>
void with_pack(c10::ScalarType dtype, int64_t row_elements, std::initializer_list<const void*> pointers,
               const char* what, F&& f) {
  with_cuda_type(dtype, what, [&](auto type) {
    using T = typename decltype(type)::type;
    constexpr int kPack = 16 / sizeof(T);
    bool vectorized = row_elements % kPack == 0;
    for (const void* pointer : pointers) vectorized = vectorized && reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0;
    if (vectorized) {
      f(type, std::integral_constant<int, kPack>{});
    } else {
      f(type, std::integral_constant<int, 1>{});
    }
  });
}

}  // namespace examples::cuda
