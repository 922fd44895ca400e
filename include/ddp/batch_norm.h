#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <ddp/export.h>

namespace ddp {

/// What fused_batch_norm computes besides the normalisation.
struct DDP_API FusedBatchNormOptions {
  /// Batch statistics (updating the running ones), or the running statistics (evaluation).
  TORCH_ARG(bool, training) = true;
  /// Running statistics: momentum * batch + (1 - momentum) * running.
  TORCH_ARG(double, momentum) = 0.1;
  /// Added to the variance.
  TORCH_ARG(double, eps) = 1e-5;
  /// max(0, .) on the result.
  TORCH_ARG(bool, relu) = true;
};

/// relu(batch_norm(input) + residual) in training, the BatchNorm, residual
/// add and ReLU of a ResNet block in one pass over the activations each way:
/// forward reads the input for its statistics and once more to write the
/// output; backward reads the output's gradient, the output (ReLU's mask)
/// and the input once for the gradients of the weight and bias and once for
/// the input's and the residual's. ATen runs BatchNorm, the add and the ReLU
/// as separate passes that each read and write the whole activation.
///
/// `input` [N, C, H, W] channels_last (or [N, C] contiguous), fp32, bf16 or
/// fp16; `residual` undefined (none) or as `input`; `weight`, `bias`,
/// `running_mean`, `running_var` [C] fp32 (weight and bias may be undefined:
/// 1 and 0). The statistics are accumulated in fp32 (Welford), the variance
/// that updates running_var unbiased. Differentiable in input, residual,
/// weight and bias.
///
/// CUDA tensors in that layout with C a multiple of 4 take the fused kernels;
/// anything else (CPU, another layout, evaluation) runs ATen's BatchNorm, add
/// and ReLU: the same values, unfused.
DDP_API at::Tensor fused_batch_norm(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                                    const at::Tensor& running_mean, const at::Tensor& running_var,
                                    const at::Tensor& residual = {}, const FusedBatchNormOptions& options = {});

/// Whether this libddp was built with fused_batch_norm's CUDA kernels
/// (LibTorch >= 2.1 with CUDA); without them every call runs ATen's ops.
DDP_API bool fused_batch_norm_kernels_built();

}  // namespace ddp
