#pragma once

// The host side of the fused RMSNorm kernels (rms_norm.cu). In ATen, RMSNorm
// takes about 8 elementwise kernels forward and 15 backward, each a full pass
// over an fp32 copy of the activations; each kernel here reads its inputs
// once and writes its outputs once, computing in fp32 as the ATen ops do and
// rounding once at the end.
//
// Tensors: contiguous, on one CUDA device, fp32, bf16 or fp16 unless said
// otherwise; the kernels run on the device's current stream. No CUDA headers:
// host code includes it. Defined only where the .cu files are compiled
// (DDP_WITH_CUDA_KERNELS).

#include <tuple>
#include <utility>

#include <ATen/core/Tensor.h>

namespace ddp::detail {

/// y = x * rsqrt(mean(x^2 over the last dim) + eps) * weight, rounded to
/// `out_dtype`, and the fp32 rsqrt per row that backward needs.
/// x [..., cols], cols > 0, rows the product of the other sizes; weight
/// [cols] fp32. Returns {y (x's shape), rstd [rows]}.
std::pair<at::Tensor, at::Tensor> rms_norm_forward(const at::Tensor& x, const at::Tensor& weight, double eps,
                                                   at::ScalarType out_dtype);

/// The gradients of rms_norm_forward: {grad_x (x's shape and dtype),
/// grad_weight (fp32)}. grad_y has y's shape and dtype.
std::pair<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& grad_y, const at::Tensor& x,
                                                    const at::Tensor& weight, const at::Tensor& rstd);

/// The residual stream's next value h = x + delta and rms_norm_forward of
/// it, in one pass: {h (x's dtype), y (out_dtype), rstd}. delta has x's
/// shape and dtype `out_dtype` (the residual branch's output, in the
/// dtype the linear layers compute in).
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_forward(const at::Tensor& x, const at::Tensor& delta,
                                                                    const at::Tensor& weight, double eps,
                                                                    at::ScalarType out_dtype);

/// The gradients of add_rms_norm_forward, given grad_y and grad_h, the
/// gradient h got from its other reader (undefined: none): {grad_x (h's
/// dtype), grad_delta (grad_y's dtype, the same values), grad_weight (fp32)}.
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_backward(const at::Tensor& grad_y, const at::Tensor& grad_h,
                                                                     const at::Tensor& h, const at::Tensor& weight,
                                                                     const at::Tensor& rstd);

}  // namespace ddp::detail
