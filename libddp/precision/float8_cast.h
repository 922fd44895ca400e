#pragma once

// The FP8 cast of Float8Linear as one CUDA kernel. Unfused, a cast costs a
// scaling multiply, a conversion, an amax reduction and, for at::_scaled_mm's
// column-major operands, a strided transpose of the result: several passes
// over the tensor, which on LLaMA-sized layers cost more than the FP8 GEMMs
// save. No CUDA headers here: float8_scaling.cpp includes it.

#include <ATen/core/Tensor.h>

namespace ddp::detail {

/// What cast_to_float8 writes; undefined members are not written.
struct Float8CastOutputs {
  /// [M, K] row-major; its dtype (at::kFloat8_e4m3fn or at::kFloat8_e5m2)
  /// picks the format.
  at::Tensor data;
  /// [K, M] row-major, the same dtype and values: the transpose, or what
  /// at::_scaled_mm reads as `data` in column-major order.
  at::Tensor transposed;
  /// 0-dim fp32: max |input| (NaN if the input has one), before scaling.
  at::Tensor amax;
};

/// Writes outputs.data = saturate(input * scale) in one pass over `input`
/// (and its transpose and amax in the same pass), on the current CUDA stream
/// of input's device, without synchronising with the host.
///
/// input: [M, K] contiguous bf16, fp16 or fp32 on a CUDA device. scale: 0-dim
/// fp32 on the same device, read by the kernel. The product is taken in fp32,
/// clamped to [-largest, largest] (NaN stays NaN) and rounded to nearest even.
///
/// Defined only where float8_cast.cu is compiled: LibTorch >= 2.1 with CUDA
/// (DDP_WITH_CUDA_KERNELS).
void cast_to_float8(const at::Tensor& input, const at::Tensor& scale, float largest, const Float8CastOutputs& outputs);

}  // namespace ddp::detail
