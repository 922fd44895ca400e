#pragma once

// The host side of libddp's FP8 CUDA kernels. Unfused, a cast costs a scaling
// multiply, a conversion, an amax reduction and, for at::_scaled_mm's
// column-major operands, a strided transpose of the result: several passes
// over the tensor, which on LLaMA-sized layers cost more than the FP8 GEMMs
// save. Each kernel here is one pass. No CUDA headers: host code includes it.
// Defined only where the .cu files are compiled (DDP_WITH_CUDA_KERNELS:
// LibTorch >= 2.1 with CUDA), except float8_largest.

#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <ddp/float8_tensor.h>

namespace ddp::detail {

struct DelayedScalingState;

/// The smallest amax a scale is computed from: keeps an all-zero tensor from
/// giving an infinite scale.
constexpr float kFloat8MinAmax = 1e-12f;

/// The largest finite value of an FP8 format, to which casts saturate.
double float8_largest(c10::ScalarType float8_dtype);

/// Delayed scaling's bookkeeping, where ATen takes a roll, two copies and
/// five 1-element kernels per history. With enter_amaxes, each history shifts
/// by one and takes entered[i] ([n] fp32, n = states.size(): the amaxes
/// reduced across ranks) or, without `entered`, its pending amax as its
/// newest entry; the pending amax is zeroed either way. Then every scale is
/// recomputed: scale = target / max(history's amax, kFloat8MinAmax). An amax
/// that is not finite and > 0 (nothing recorded yet, an all-zero tensor, an
/// overflow, NaN) keeps the old scale, as in Transformer Engine.
///
/// One block per history (histories are short: Transformer Engine's default
/// is 1024 entries), many histories per launch: a model's layers need a few
/// launches, not one per cast. All tensors on one CUDA device; runs on its
/// current stream.
void update_amax_histories(const std::vector<DelayedScalingState*>& states, bool enter_amaxes,
                           const at::Tensor& entered = {});

/// silu(gate) * up, computed in fp32 and written straight into the FP8 cast
/// `y` (float8::cast_transpose's rules), with no bf16 result: gate and up
/// [rows, cols], one dtype, each row contiguous (two contiguous matrices, or
/// the column halves of one [rows, 2 cols]).
void swiglu_to_float8(const at::Tensor& gate, const at::Tensor& up, Float8Tensor& y);

/// The gradients of silu(gate) * up for grad_y, written likewise as FP8
/// casts in one format: grad_y, gate and up [rows, cols], each row
/// contiguous. grad_gate and grad_up may be the halves of one
/// cast: their data the column halves of one [rows, 2 cols], their
/// transposes the row halves of one [2 cols, rows], one scale and amax.
void swiglu_gradients_to_float8(const at::Tensor& grad_y, const at::Tensor& gate, const at::Tensor& up,
                                Float8Tensor& grad_gate, Float8Tensor& grad_up);

/// Whether rms_norm_to_float8 takes x [..., cols] (and delta, if defined):
/// contiguous fp32, bf16 or fp16 CUDA tensors on one device, 16-byte
/// aligned, rows and cols multiples of 16 (as FP8 matmuls need), and cols few
/// enough that a block's shared memory holds 32 rows of the FP8 output
/// (7,000 or so on an H100).
bool rms_norm_to_float8_takes(const at::Tensor& x, const at::Tensor& delta);

/// x * rsqrt(mean(x^2 over the last dim) + eps) * weight (of x + delta,
/// where delta is defined, which is also written to `sum`), computed in fp32,
/// rounded to out_dtype (the dtype an unfused norm would return, which the
/// cast would read), and written straight into the FP8 cast `y` (data,
/// transpose and amax, with y's given scale: delayed scaling), with the
/// per-row rsqrt to `rstd` [rows] for backward. x, delta and sum [rows,
/// cols] as rms_norm_to_float8_takes says; delta in out_dtype, sum in x's
/// dtype; weight [cols] fp32, contiguous and 16-byte aligned.
void rms_norm_to_float8(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps,
                        c10::ScalarType out_dtype, const at::Tensor& sum, const at::Tensor& rstd, Float8Tensor& y);

/// Whether add_rms_norm_backward_to_float8 takes a sum h of x's shape and
/// dtype: fp32, bf16 or fp16 on a CUDA device, rows and cols multiples of 16
/// (as FP8 matmuls need). (The sum forward saves is contiguous.)
bool add_rms_norm_backward_to_float8_takes(const at::Tensor& h);

/// add_rms_norm_backward (rmsnorm/kernels.h) with the gradient of delta
/// written as the E5M2 cast `grad_delta` (data and transpose [rows, cols] and
/// [cols, rows], amax, with its given scale: delayed scaling) instead of in
/// grad_y's dtype: the values the unfused backward would write, cast. h as
/// add_rms_norm_backward_to_float8_takes says; grad_y of h's shape, grad_h
/// (undefined: none) of h's shape and dtype; weight [cols] and rstd [rows]
/// fp32. Returns {grad_x (h's dtype), grad_weight (fp32)}.
std::pair<at::Tensor, at::Tensor> add_rms_norm_backward_to_float8(const at::Tensor& grad_y, const at::Tensor& grad_h,
                                                                  const at::Tensor& h, const at::Tensor& weight,
                                                                  const at::Tensor& rstd, Float8Tensor& grad_delta);

/// The transpose [cols, rows] of the one-byte matrix `data` [rows, cols]
/// into `transposed`, byte for byte: rows a multiple of 4, cols of 16, data
/// 16-byte and transposed 4-byte aligned, both contiguous on one GPU.
void transpose_float8(const at::Tensor& data, const at::Tensor& transposed);

}  // namespace ddp::detail
