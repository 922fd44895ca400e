#pragma once

#include <memory>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <ddp/export.h>

namespace ddp {

class ProcessGroup;

/// Which kernels fused_batch_norm runs on CUDA.
enum class FusedBatchNormPath {
  /// cuDNN's where cuDNN runs the configuration, else libddp's, else ATen's ops.
  kAuto,
  /// cuDNN's fused NHWC BatchNorm + add + ReLU (its persistent kernels keep
  /// the activations on chip between statistics and normalisation), else
  /// ATen's ops; those also where the statistics are synchronised.
  kCudnn,
  /// libddp's own kernels (Welford statistics; two passes each way), else ATen's ops.
  kLibddp,
  /// ATen's BatchNorm, add and ReLU as separate ops: the unfused reference.
  kAten,
};

/// What fused_batch_norm computes besides the normalisation, and how.
struct DDP_API FusedBatchNormOptions {
  /// Batch statistics (updating the running ones), or the running statistics (evaluation).
  TORCH_ARG(bool, training) = true;
  /// Running statistics: momentum * batch + (1 - momentum) * running.
  TORCH_ARG(double, momentum) = 0.1;
  /// Added to the variance.
  TORCH_ARG(double, eps) = 1e-5;
  /// max(0, .) on the result.
  TORCH_ARG(bool, relu) = true;
  /// Which kernels run it on CUDA.
  TORCH_ARG(FusedBatchNormPath, path) = FusedBatchNormPath::kAuto;
  /// In training, the statistics of every rank's batch in this group, as
  /// ddp::sync_batch_norm computes them (every rank calls, in the same order
  /// of layers); null, or a group of one: this rank's batch.
  TORCH_ARG(std::shared_ptr<ProcessGroup>, process_group);
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
/// In training, CUDA tensors in that layout take fused kernels (options.path):
/// cuDNN's for [N, C, H, W] where cuDNN runs the shape and dtype (and ATen
/// may use cuDNN), libddp's for C a multiple of 4; anything else (CPU,
/// another layout, evaluation) runs ATen's BatchNorm, add and ReLU: the same
/// values, unfused. With options.process_group, libddp's kernels split each
/// direction at one all-reduce (2C + 1 fp64 numbers forward, 2C backward) and
/// take any batch size on a rank, 0 included, and any memory format (copied
/// into channels_last, the output copied back): the path depends only on the
/// device, dtype, number of dimensions and channels, alike on every rank; elsewhere
/// ddp::sync_batch_norm, then the add and ReLU. The weight's and bias's
/// gradients are then this rank's part, which DDP averages.
DDP_API at::Tensor fused_batch_norm(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                                    const at::Tensor& running_mean, const at::Tensor& running_var,
                                    const at::Tensor& residual = {}, const FusedBatchNormOptions& options = {});

/// Whether this libddp was built with `path`: kLibddp needs LibTorch >= 2.1
/// with CUDA, kCudnn also cuDNN's headers; kAuto either of them; kAten is
/// always there. Without a path its calls run ATen's ops.
DDP_API bool fused_batch_norm_path_built(FusedBatchNormPath path);

}  // namespace ddp
