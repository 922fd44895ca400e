#include <ddp/batch_norm.h>

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <ddp/communicator.h>
#include <ddp/errors.h>
#include <ddp/process_group.h>
#include <ddp/sync_batch_norm.h>

#include "batchnorm/absent_tensor.h"
#include "batchnorm/group_capsule.h"
#include "batchnorm/kernels.h"
#include "cuda/alignment.h"
#ifdef DDP_WITH_CUDNN
#include "batchnorm/cudnn_batch_norm.h"
#endif

namespace ddp {
namespace {

/// The group whose ranks' batches are normalised together; null for this rank's alone.
std::shared_ptr<ProcessGroup> synchronised_over(const FusedBatchNormOptions& options) {
  const auto& group = options.process_group();
  return options.training() && group && group->world_size() > 1 ? group : nullptr;
}

/// ATen's BatchNorm (or sync_batch_norm), add and ReLU, one pass each: the
/// reference, and the path of whatever the kernels do not take.
at::Tensor unfused(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                   const at::Tensor& running_mean, const at::Tensor& running_var, const at::Tensor& residual,
                   const FusedBatchNormOptions& options) {
  const std::shared_ptr<ProcessGroup> group = synchronised_over(options);
  at::Tensor y =
      group ? sync_batch_norm(input, weight, bias, running_mean, running_var, options.momentum(), options.eps(), group)
            : at::batch_norm(input, weight, bias, running_mean, running_var, options.training(), options.momentum(),
                             options.eps(), at::globalContext().userEnabledCuDNN());
  if (residual.defined()) y = y + residual;
  return options.relu() ? at::relu(y) : y;
}

#ifdef DDP_WITH_CUDA_KERNELS
using detail::or_empty;
using detail::unless_empty;

bool fp32(const at::Tensor& tensor) { return tensor.defined() && tensor.scalar_type() == at::kFloat; }
bool fp32_or_none(const at::Tensor& tensor) { return !tensor.defined() || fp32(tensor); }

/// The memory the kernels read: channels_last for [N, C, H, W], else contiguous.
at::MemoryFormat kernel_format(const at::Tensor& input) {
  return input.dim() == 4 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
}

/// Contiguous in `format`, its data on a 16-byte boundary (the kernels' widest
/// loads): a view that is not (a residual or gradient in another layout, a
/// synchronised rank's input in another layout or misaligned) gets copied.
at::Tensor kernel_ready(const at::Tensor& tensor, at::MemoryFormat format) {
  if (!tensor.defined()) return tensor;
  const at::Tensor contiguous = tensor.contiguous(format);
  if (detail::aligned(contiguous.data_ptr(), 16)) return contiguous;
  return contiguous.clone(format);
}

/// The fused kernels under autograd: saves the input and the output (ReLU's
/// mask) and the batch's mean and inverse standard deviation. With a group
/// (null for none), each direction all-reduces its sums between the kernels,
/// and the output comes back in the input's memory format. `has_residual`
/// tells a given residual that is empty (an empty batch) from none.
class FusedBatchNormFunction : public torch::autograd::Function<FusedBatchNormFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input_as_given,
                            const at::Tensor& residual_or_empty, const at::Tensor& weight_or_empty,
                            const at::Tensor& bias_or_empty, const at::Tensor& running_mean_or_empty,
                            const at::Tensor& running_var_or_empty, double momentum, double eps, bool relu,
                            bool has_residual, const std::shared_ptr<ProcessGroup>& group) {
    const at::MemoryFormat format = kernel_format(input_as_given);
    const at::Tensor input = kernel_ready(input_as_given, format);
    const at::Tensor residual = has_residual ? kernel_ready(residual_or_empty, format) : at::Tensor();
    const at::Tensor weight = unless_empty(weight_or_empty);
    const at::Tensor bias = unless_empty(bias_or_empty);
    const at::Tensor running_mean = unless_empty(running_mean_or_empty);
    const at::Tensor running_var = unless_empty(running_var_or_empty);
    const auto floats = input.options().dtype(at::kFloat);
    at::Tensor output = at::empty_like(input);
    at::Tensor mean = at::empty({input.size(1)}, floats);
    at::Tensor invstd = at::empty({input.size(1)}, floats);
    at::Tensor moments;
    if (group) {
      moments = at::empty({1 + 2 * input.size(1)}, input.options().dtype(at::kDouble));
      detail::batch_norm_local_moments(input, moments);
      group->communicator().all_reduce(moments)->wait_stream();
      detail::fused_batch_norm_forward_from_moments(input, residual, weight, bias, running_mean, running_var, momentum,
                                                    eps, relu, moments, output, mean, invstd);
      ctx->saved_data["group"] = detail::capsule_of(group);
    } else {
      detail::fused_batch_norm_forward(input, residual, weight, bias, running_mean, running_var, momentum, eps, relu,
                                       output, mean, invstd);
    }
    // Only a synchronised backward reads the all-reduced moments (their count).
    std::vector<at::Tensor> saved{input, output, weight_or_empty, mean, invstd};
    if (group) saved.push_back(moments);
    ctx->save_for_backward(saved);
    ctx->saved_data["relu"] = relu;
    ctx->saved_data["residual"] = has_residual;
    ctx->saved_data["weight"] = weight.defined();
    // The kernels' channels_last output, as the caller's layout: a synchronised rank's input may have come in another.
    return input_as_given.is_contiguous(format) ? output : output.contiguous(input_as_given.suggest_memory_format());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& output = saved[1];
    const at::Tensor weight = unless_empty(saved[2]);
    const bool relu = ctx->saved_data["relu"].toBool();
    const bool synchronised = ctx->saved_data.count("group") != 0;
    // The kernels read the gradient in the activations' layout.
    const at::Tensor grad_output = kernel_ready(grads[0], kernel_format(input));
    const auto floats = input.options().dtype(at::kFloat);
    at::Tensor grad_input = at::empty_like(input);
    at::Tensor grad_residual = ctx->saved_data["residual"].toBool() ? at::empty_like(input) : at::Tensor();
    at::Tensor grad_weight = at::empty({input.size(1)}, floats);
    at::Tensor grad_bias = at::empty({input.size(1)}, floats);
    if (synchronised) {
      const at::Tensor local_sums = at::empty({2 * input.size(1)}, input.options().dtype(at::kDouble));
      detail::batch_norm_local_gradient_sums(grad_output, output, input, saved[3], relu, local_sums);
      const at::Tensor global_sums = local_sums.clone();
      detail::group_in(ctx->saved_data["group"]).communicator().all_reduce(global_sums)->wait_stream();
      detail::fused_batch_norm_backward_from_sums(grad_output, output, input, weight, saved[3], saved[4], relu,
                                                  local_sums, global_sums, saved[5], grad_input, grad_residual,
                                                  grad_weight, grad_bias);
    } else {
      detail::fused_batch_norm_backward(grad_output, output, input, weight, saved[3], saved[4], relu, grad_input,
                                        grad_residual, grad_weight, grad_bias);
    }
    const bool affine = ctx->saved_data["weight"].toBool();
    return {grad_input,
            grad_residual,
            affine ? grad_weight : at::Tensor(),
            affine ? grad_bias : at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};
#endif

void check_arguments(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& residual) {
  if (input.dim() < 2) {
    throw UsageError(fmt::format("ddp::fused_batch_norm: input must be [N, C, ...], got {} dimensions", input.dim()));
  }
  if (weight.defined() && weight.numel() != input.size(1)) {
    throw UsageError(fmt::format("ddp::fused_batch_norm: {} channels but a weight of {} elements", input.size(1),
                                 weight.numel()));
  }
  if (residual.defined() && (residual.sizes() != input.sizes() || residual.scalar_type() != input.scalar_type())) {
    throw UsageError("ddp::fused_batch_norm: the residual must have the input's shape and dtype");
  }
}

}  // namespace

bool fused_batch_norm_path_built(FusedBatchNormPath path) {
  bool cudnn = false, libddp = false;
#ifdef DDP_WITH_CUDNN
  cudnn = true;
#endif
#ifdef DDP_WITH_CUDA_KERNELS
  libddp = true;
#endif
  switch (path) {
    case FusedBatchNormPath::kAuto: return cudnn || libddp;
    case FusedBatchNormPath::kCudnn: return cudnn;
    case FusedBatchNormPath::kLibddp: return libddp;
    case FusedBatchNormPath::kAten: return true;
  }
  return false;
}

at::Tensor fused_batch_norm(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                            const at::Tensor& running_mean, const at::Tensor& running_var, const at::Tensor& residual,
                            const FusedBatchNormOptions& options) {
  check_arguments(input, weight, residual);
  const FusedBatchNormPath path = options.path();
  if (!options.training() || path == FusedBatchNormPath::kAten) {
    return unfused(input, weight, bias, running_mean, running_var, residual, options);
  }
  const std::shared_ptr<ProcessGroup> group = synchronised_over(options);
#ifdef DDP_WITH_CUDNN
  // cuDNN's kernels need every per-channel tensor.
  if (!group && (path == FusedBatchNormPath::kAuto || path == FusedBatchNormPath::kCudnn) && fp32(weight) &&
      fp32(bias) && fp32(running_mean) && fp32(running_var) &&
      detail::cudnn_runs_batch_norm(input, residual, options.relu(), options.eps())) {
    return detail::cudnn_batch_norm(input, residual, weight, bias, running_mean, running_var, options.momentum(),
                                    options.eps(), options.relu());
  }
#endif
#ifdef DDP_WITH_CUDA_KERNELS
  // Synchronised, the choice must be every rank's alike: not by this rank's
  // batch (which may be empty), strides or alignment (copied).
  const bool kernels_take_input =
      group ? detail::fits_synchronised_batch_norm(input) : detail::fits_fused_batch_norm(input);
  if ((path == FusedBatchNormPath::kAuto || path == FusedBatchNormPath::kLibddp) && fp32_or_none(weight) &&
      fp32_or_none(bias) && fp32_or_none(running_mean) && fp32_or_none(running_var) && kernels_take_input) {
    return FusedBatchNormFunction::apply(
        input, or_empty(residual, input), or_empty(weight, input), or_empty(bias, input), or_empty(running_mean, input),
        or_empty(running_var, input), options.momentum(), options.eps(), options.relu(), residual.defined(), group);
  }
#endif
  return unfused(input, weight, bias, running_mean, running_var, residual, options);
}

}  // namespace ddp
