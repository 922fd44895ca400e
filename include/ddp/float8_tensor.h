#pragma once

#include <ATen/core/Tensor.h>

#include <ddp/export.h>

namespace ddp {

/// An FP8 matrix with its scaling, the one FP8 tensor type of libddp (as
/// Transformer Engine's Float8Tensor): `data` holds round(x * scale),
/// saturated to the format's largest finite value, and `inverse_scale` turns
/// it back into x (what at::_scaled_mm calls its scale). at::_scaled_mm reads
/// its first operand row-major and its second column-major, and a
/// Float8Linear needs each cast matrix in both roles, so a cast can also give
/// the transpose.
struct Float8Tensor {
  /// [M, K] row-major, float8_e4m3fn or float8_e5m2 (the dtype picks the
  /// format). Undefined where only the transpose is wanted.
  at::Tensor data;
  /// [K, M] row-major, the same dtype and values: data in column-major order.
  /// Undefined where not wanted.
  at::Tensor transposed;
  /// 0-dim fp32: max |x| (NaN if x has one). With `scale` given, a cast
  /// max-accumulates into it (zero it first); without, it must hold x's amax.
  at::Tensor amax;
  /// 0-dim fp32. Undefined before a cast: the cast takes the scale that maps
  /// `amax` to the format's largest value (current scaling) and writes it.
  at::Tensor scale;
  /// 0-dim fp32: 1 / scale, written by the cast.
  at::Tensor inverse_scale;
};

namespace float8 {

/// Writes `output`, the FP8 cast of the matrix `input`, in one pass over it,
/// as Float8Tensor says: `output.data` and/or `output.transposed` (allocated
/// by the caller, one FP8 dtype), the amax where given, the inverse scale,
/// and the scale where none was given (these two allocated here if undefined). input: [M, K] bf16, fp16 or fp32 on a
/// CUDA device, each row contiguous (a column range of a wider matrix too, as is output.data); products are taken in
/// fp32, saturated and rounded to nearest even. Runs on the current CUDA stream without synchronising with the host.
/// Throws UsageError where libddp was built without its CUDA kernels (LibTorch < 2.1 or without CUDA).
DDP_API void cast_transpose(const at::Tensor& input, Float8Tensor& output);

}  // namespace float8
}  // namespace ddp
