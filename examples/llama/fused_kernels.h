#pragma once

// The LLaMA decoder's non-GEMM layers as fused CUDA kernels. In ATen, RMSNorm
// takes about 8 elementwise kernels forward and 15 backward, each a full pass
// over an fp32 copy of the activations, and the rotary embedding and SwiGLU
// several more; on tinyllama-1.1b that is about half of a bf16 step. Each
// kernel here reads its inputs once and writes its outputs once, computing in
// fp32 as the ATen ops do and rounding once at the end.
//
// Tensors: contiguous, on one CUDA device, fp32, bf16 or fp16 unless said
// otherwise; the kernels run on the device's current stream. No CUDA headers
// here: fused_ops.cpp includes it. Defined only where fused_kernels.cu is
// compiled (LLAMA_WITH_CUDA_KERNELS).

#include <utility>

#include <ATen/core/Tensor.h>

namespace llama::kernels {

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

/// Rotates consecutive feature pairs of x [batch, seq, heads, head_dim] by the
/// angles of their position: (e, o) -> (e cos - o sin, e sin + o cos), with
/// cos and sin [seq, head_dim / 2] fp32. `inverse` rotates by the negated
/// angles, which is the gradient of the rotation.
at::Tensor rotate_pairs(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool inverse);

/// silu(gate) * up, gate and up of one shape and dtype.
at::Tensor swiglu_forward(const at::Tensor& gate, const at::Tensor& up);

/// The gradients of swiglu_forward: {grad_gate, grad_up}.
std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& grad_y, const at::Tensor& gate,
                                                  const at::Tensor& up);

}  // namespace llama::kernels
