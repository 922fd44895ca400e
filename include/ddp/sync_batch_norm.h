#pragma once

#include <memory>
#include <ostream>

#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>

#include <ddp/export.h>
#include <ddp/process_group.h>

namespace ddp {

/// Batch normalisation in training with the statistics of every rank's
/// batch, as one process normalising the ranks' batches laid end to end
/// (PyTorch's SyncBatchNorm): for small per-rank batches, where one rank's
/// statistics are too noisy. `input` is [N, C, ...]; the ranks may have
/// different N (0 too, while some rank has elements: with none anywhere the
/// output is NaN). Each call all-reduces 2C + 1 numbers in forward and
/// in backward 2C + 1 more (the gradient of the statistics); every rank must
/// call it, in the same order of layers. `running_mean` and `running_var`
/// (if defined) are updated with the global statistics: momentum * new +
/// (1 - momentum) * old, the variance unbiased over all ranks' elements.
/// Returns the output in the input's dtype; the statistics are computed in
/// fp32 (fp64 for fp64 input) and combined across ranks in fp64. Gradients of
/// `weight` and `bias` are this rank's part, which DDP then averages.
DDP_API at::Tensor sync_batch_norm(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                                   const at::Tensor& running_mean, const at::Tensor& running_var, double momentum,
                                   double eps, const std::shared_ptr<ProcessGroup>& group);

/// torch::nn::BatchNorm{1,2,3}d with statistics over every rank's batch in
/// training (sync_batch_norm); in evaluation, and on one rank, exactly
/// torch::nn::BatchNorm. Its parameters and buffers have BatchNorm's names,
/// so checkpoints move between the two.
///
///   auto group = ddp::init();
///   ddp::SyncBatchNorm norm(torch::nn::BatchNormOptions(64), group);
class DDP_API SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  /// `group`: the ranks whose batches are normalised together.
  SyncBatchNormImpl(torch::nn::BatchNormOptions options, std::shared_ptr<ProcessGroup> group);

  /// (Re)creates the parameters and buffers from the options.
  void reset() override;
  /// Running mean 0, running variance 1, no batches tracked.
  void reset_running_stats();
  /// Running statistics reset, weight 1 and bias 0.
  void reset_parameters();
  /// "ddp::SyncBatchNorm(64, eps=1e-05, momentum=0.1, affine=true, track_running_stats=true)".
  void pretty_print(std::ostream& stream) const override;
  /// `input` [N, C, ...] with C = num_features; UsageError otherwise. In
  /// training on CUDA, [N, C, H, W] or [N, C] with C a multiple of 4, the
  /// statistics run in ddp::fused_batch_norm's kernels with their all-reduces
  /// between the passes; elsewhere sync_batch_norm.
  at::Tensor forward(const at::Tensor& input);
  /// The ranks whose batches are normalised together.
  const std::shared_ptr<ProcessGroup>& group() const { return group_; }

  torch::nn::BatchNormOptions options;  ///< As torch::nn::BatchNorm's.
  at::Tensor weight;                    ///< [C], if affine.
  at::Tensor bias;                      ///< [C], if affine.
  at::Tensor running_mean;              ///< [C], if track_running_stats.
  at::Tensor running_var;               ///< [C], if track_running_stats.
  at::Tensor num_batches_tracked;       ///< Scalar long, if track_running_stats.

 private:
  std::shared_ptr<ProcessGroup> group_;
};

/// A holder of SyncBatchNormImpl, as torch::nn::BatchNorm2d is of BatchNorm2dImpl.
TORCH_MODULE(SyncBatchNorm);

}  // namespace ddp
