#pragma once

// The host side of the fused BatchNorm kernels (fused_batch_norm.cu). The
// activations are rows x channels: NHWC (channels_last) memory, C innermost.
// No CUDA headers: host code includes it. Defined only where the .cu files
// are compiled (DDP_WITH_CUDA_KERNELS).

#include <ATen/core/Tensor.h>

namespace ddp::detail {

/// Whether the fused kernels take `input`: CUDA, fp32/bf16/fp16,
/// [N, C, H, W] channels_last or [N, C] contiguous, C a multiple of 4, not
/// empty and its data aligned to 4 elements.
bool fits_fused_batch_norm(const at::Tensor& input);

/// What of that every rank's input has alike: CUDA, the dtype, 4 or 2
/// dimensions, C a multiple of 4; not the batch (an empty one included) nor
/// the strides or alignment, which a copy into channels_last (contiguous) memory
/// mends. Synchronised BatchNorm chooses its path by this, so that the ranks
/// meet in the same collectives.
bool fits_synchronised_batch_norm(const at::Tensor& input);

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

// Synchronised BatchNorm (statistics over every rank's batch) splits each
// direction at its all-reduce: this rank's sums, then, from the sums over
// the ranks, the same finishing and elementwise pass as above. The sums are
// fp64 (the all-reduced buffer); a rank with no rows contributes zeros and
// still updates its running statistics and weight and bias gradients (0).

/// Forward, before the all-reduce: `moments` [1 + 2C] fp64 = {count, per
/// channel the sum of x, the sum of x^2}.
void batch_norm_local_moments(const at::Tensor& input, const at::Tensor& moments);

/// Forward, after: as fused_batch_norm_forward with the statistics of the
/// all-reduced `moments` (running_var's update unbiased over every row).
void fused_batch_norm_forward_from_moments(const at::Tensor& input, const at::Tensor& residual,
                                           const at::Tensor& weight, const at::Tensor& bias,
                                           const at::Tensor& running_mean, const at::Tensor& running_var,
                                           double momentum, double eps, bool relu, const at::Tensor& moments,
                                           const at::Tensor& output, const at::Tensor& mean, const at::Tensor& invstd);

/// Backward, before the all-reduce: `sums` [2C] fp64 = {per channel the sum
/// of dz, of dz * (x - mean)}, dz the gradient under the ReLU.
void batch_norm_local_gradient_sums(const at::Tensor& grad_output, const at::Tensor& output, const at::Tensor& input,
                                    const at::Tensor& mean, bool relu, const at::Tensor& sums);

/// Backward, after: the input's (and residual's) gradient from `global_sums`
/// and the count in the all-reduced `moments`; `grad_weight` and `grad_bias`
/// from `local_sums`, this rank's part (DDP averages them, as PyTorch's
/// SyncBatchNorm leaves them).
void fused_batch_norm_backward_from_sums(const at::Tensor& grad_output, const at::Tensor& output,
                                         const at::Tensor& input, const at::Tensor& weight, const at::Tensor& mean,
                                         const at::Tensor& invstd, bool relu, const at::Tensor& local_sums,
                                         const at::Tensor& global_sums, const at::Tensor& moments,
                                         const at::Tensor& grad_input, const at::Tensor& grad_residual,
                                         const at::Tensor& grad_weight, const at::Tensor& grad_bias);

}  // namespace ddp::detail
