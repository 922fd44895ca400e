#pragma once

// cuDNN's fused BatchNorm (+ residual add) (+ ReLU) for training, under
// autograd: cudnnBatchNormalizationForwardTrainingEx and BackwardEx in the
// persistent spatial mode, whose NHWC kernels keep a channel's activations
// on chip from the statistics to the normalisation. No cuDNN headers: host
// code includes it. Defined only where libddp is built with cuDNN
// (DDP_WITH_CUDNN).

#include <ATen/core/Tensor.h>

namespace ddp::detail {

/// Whether cuDNN runs this training configuration: a CUDA [N, C, H, W]
/// channels_last fp32/bf16/fp16 input (and residual), eps at least cuDNN's
/// minimum, and cuDNN's own answer for the shape (its workspace queries).
bool cudnn_runs_batch_norm(const at::Tensor& input, const at::Tensor& residual, bool relu, double eps);

/// relu(batch_norm(input) + residual) with the batch's statistics, updating
/// the running ones; differentiable in input, residual (may be undefined),
/// weight and bias. weight, bias, running_mean and running_var: [C] fp32.
at::Tensor cudnn_batch_norm(const at::Tensor& input, const at::Tensor& residual, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& running_mean, const at::Tensor& running_var,
                            double momentum, double eps, bool relu);

}  // namespace ddp::detail
