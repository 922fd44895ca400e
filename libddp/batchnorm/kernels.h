#pragma once

// The host side of the fused BatchNorm kernels (fused_batch_norm.cu). The
// activations are rows x channels: NHWC (channels_last) memory, C innermost.
// No CUDA headers: host code includes it. Defined only where the .cu files
// are compiled (DDP_WITH_CUDA_KERNELS).

#include <ATen/core/Tensor.h>

namespace ddp::detail {

/// Whether the fused kernels take `input`: CUDA, fp32/bf16/fp16,
/// [N, C, H, W] channels_last or [N, C] contiguous, C a multiple of 4.
bool fits_fused_batch_norm(const at::Tensor& input);

/// Forward in training. Writes `output` (as `input`), `mean` and `invstd`
/// ([C] fp32, the batch's) and updates the running statistics (if defined).
/// `residual` may be undefined; `weight` and `bias` too (1 and 0).
void fused_batch_norm_forward(const at::Tensor& input, const at::Tensor& residual, const at::Tensor& weight,
                              const at::Tensor& bias, const at::Tensor& running_mean, const at::Tensor& running_var,
                              double momentum, double eps, bool relu, const at::Tensor& output,
                              const at::Tensor& mean, const at::Tensor& invstd);

/// Backward: from the output's gradient `grad_output`, the output (ReLU's
/// mask, if `relu`) and the input, writes `grad_input`, `grad_residual` (if
/// defined) and `grad_weight`, `grad_bias` ([C] fp32).
void fused_batch_norm_backward(const at::Tensor& grad_output, const at::Tensor& output, const at::Tensor& input,
                               const at::Tensor& weight, const at::Tensor& mean, const at::Tensor& invstd, bool relu,
                               const at::Tensor& grad_input, const at::Tensor& grad_residual,
                               const at::Tensor& grad_weight, const at::Tensor& grad_bias);

}  // namespace ddp::detail
