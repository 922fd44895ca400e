#include <ddp/batch_norm.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <ddp/errors.h>

#include "batchnorm/absent_tensor.h"
#include "batchnorm/kernels.h"
#ifdef DDP_WITH_CUDNN
#include "batchnorm/cudnn_batch_norm.h"
#endif

namespace ddp {
namespace {

/// ATen's BatchNorm, add and ReLU, one pass each: the reference, and the path
/// of whatever the kernels do not take.
at::Tensor unfused(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                   const at::Tensor& running_mean, const at::Tensor& running_var, const at::Tensor& residual,
                   const FusedBatchNormOptions& options) {
  at::Tensor y = at::batch_norm(input, weight, bias, running_mean, running_var, options.training(), options.momentum(),
                                options.eps(), at::globalContext().userEnabledCuDNN());
  if (residual.defined()) y = y + residual;
  return options.relu() ? at::relu(y) : y;
}

#ifdef DDP_WITH_CUDA_KERNELS
using detail::or_empty;
using detail::unless_empty;

bool fp32(const at::Tensor& tensor) { return tensor.defined() && tensor.scalar_type() == at::kFloat; }
bool fp32_or_none(const at::Tensor& tensor) { return !tensor.defined() || fp32(tensor); }

/// The fused kernels under autograd: saves the input and the output (ReLU's
/// mask) and the batch's mean and inverse standard deviation.
class FusedBatchNormFunction : public torch::autograd::Function<FusedBatchNormFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& residual_or_empty, const at::Tensor& weight_or_empty,
                            const at::Tensor& bias_or_empty, const at::Tensor& running_mean_or_empty,
                            const at::Tensor& running_var_or_empty, double momentum, double eps, bool relu) {
    const at::Tensor residual = unless_empty(residual_or_empty);
    const at::Tensor weight = unless_empty(weight_or_empty);
    const at::Tensor bias = unless_empty(bias_or_empty);
    const at::Tensor running_mean = unless_empty(running_mean_or_empty);
    const at::Tensor running_var = unless_empty(running_var_or_empty);
    const auto floats = input.options().dtype(at::kFloat);
    at::Tensor output = at::empty_like(input);
    at::Tensor mean = at::empty({input.size(1)}, floats);
    at::Tensor invstd = at::empty({input.size(1)}, floats);
    detail::fused_batch_norm_forward(input, residual, weight, bias, running_mean, running_var, momentum, eps, relu,
                                     output, mean, invstd);
    ctx->save_for_backward({input, output, weight_or_empty, mean, invstd});
    ctx->saved_data["relu"] = relu;
    ctx->saved_data["residual"] = residual.defined();
    ctx->saved_data["weight"] = weight.defined();
    return output;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& output = saved[1];
    // The kernels read the gradient in the activations' layout.
    const at::Tensor grad_output = grads[0].contiguous(input.suggest_memory_format());
    const auto floats = input.options().dtype(at::kFloat);
    at::Tensor grad_input = at::empty_like(input);
    at::Tensor grad_residual = ctx->saved_data["residual"].toBool() ? at::empty_like(input) : at::Tensor();
    at::Tensor grad_weight = at::empty({input.size(1)}, floats);
    at::Tensor grad_bias = at::empty({input.size(1)}, floats);
    detail::fused_batch_norm_backward(grad_output, output, input, unless_empty(saved[2]), saved[3], saved[4],
                                      ctx->saved_data["relu"].toBool(), grad_input, grad_residual, grad_weight,
                                      grad_bias);
    const bool affine = ctx->saved_data["weight"].toBool();
    return {grad_input,   grad_residual, affine ? grad_weight : at::Tensor(), affine ? grad_bias : at::Tensor(),
            at::Tensor(), at::Tensor(),  at::Tensor(),                        at::Tensor(),
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
#ifdef DDP_WITH_CUDNN
  // cuDNN's kernels need every per-channel tensor.
  if ((path == FusedBatchNormPath::kAuto || path == FusedBatchNormPath::kCudnn) && fp32(weight) && fp32(bias) &&
      fp32(running_mean) && fp32(running_var) &&
      detail::cudnn_runs_batch_norm(input, residual, options.relu(), options.eps())) {
    return detail::cudnn_batch_norm(input, residual, weight, bias, running_mean, running_var, options.momentum(),
                                    options.eps(), options.relu());
  }
#endif
#ifdef DDP_WITH_CUDA_KERNELS
  if ((path == FusedBatchNormPath::kAuto || path == FusedBatchNormPath::kLibddp) && fp32_or_none(weight) &&
      fp32_or_none(bias) && fp32_or_none(running_mean) && fp32_or_none(running_var) &&
      detail::fits_fused_batch_norm(input) &&
      (!residual.defined() || residual.is_contiguous(input.suggest_memory_format()))) {
    return FusedBatchNormFunction::apply(input, or_empty(residual, input), or_empty(weight, input),
                                         or_empty(bias, input), or_empty(running_mean, input),
                                         or_empty(running_var, input), options.momentum(), options.eps(),
                                         options.relu());
  }
#endif
  return unfused(input, weight, bias, running_mean, running_var, residual, options);
}

}  // namespace ddp
