#include <ddp/rms_norm.h>

#include <optional>
#include <utility>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <ddp/precision.h>

#include "rmsnorm/autograd.h"
#include "rmsnorm/kernels.h"

namespace ddp {
namespace detail {

std::optional<c10::ScalarType> fused_rms_norm_dtype(const at::Tensor& x, const at::Tensor& weight,
                                                    const RMSNormOptions& options) {
  const auto dtype = x.scalar_type();
  const bool kernel_dtype = dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf;
  if (!rms_norm_kernels_built() || !options.fused() || !x.is_cuda() || !kernel_dtype || x.dim() < 1 ||
      x.size(-1) == 0 || weight.dim() != 1 || weight.size(0) != x.size(-1) || weight.device() != x.device()) {
    return std::nullopt;
  }
  const AutocastState autocast = AutocastState::current(c10::DeviceType::CUDA);
  return dtype == at::kFloat && autocast.enabled ? autocast.dtype : dtype;
}

#ifdef DDP_WITH_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

/// The backward kernels are not recorded by autograd, so gradients of these
/// gradients would silently be missing: refuse, as Python's
/// once_differentiable does.
void check_not_differentiated_twice(const char* op) {
  TORCH_CHECK(!at::GradMode::is_enabled(), "ddp::", op,
              ": the fused backward cannot be differentiated again (create_graph); pass "
              "RMSNormOptions().fused(false) for higher-order gradients");
}

}  // namespace

void save_rms_norm_for_backward(AutogradContext* context, const at::Tensor& normed, const at::Tensor& weight32,
                                const at::Tensor& rstd, c10::ScalarType weight_dtype, c10::ScalarType out_dtype) {
  context->save_for_backward({normed, weight32, rstd});
  context->saved_data["weight_dtype"] = weight_dtype;
  context->saved_data["out_dtype"] = out_dtype;
}

variable_list add_rms_norm_forward_saved(AutogradContext* context, const at::Tensor& x, const at::Tensor& delta,
                                         const at::Tensor& weight32, c10::ScalarType weight_dtype, double eps,
                                         c10::ScalarType out_dtype) {
  auto [h, y, rstd] = add_rms_norm_forward(x.contiguous(), delta.contiguous(), weight32, eps, out_dtype);
  save_rms_norm_for_backward(context, h, weight32, rstd, weight_dtype, out_dtype);
  return {h, y};
}

SavedRmsNorm saved_rms_norm(AutogradContext* context, const char* op) {
  check_not_differentiated_twice(op);
  const auto saved = context->get_saved_variables();
  return {saved[0], saved[1], saved[2], context->saved_data["weight_dtype"].toScalarType(),
          context->saved_data["out_dtype"].toScalarType()};
}

variable_list rms_norm_gradients(AutogradContext* context, const variable_list& grad_outputs) {
  const SavedRmsNorm saved = saved_rms_norm(context, "rms_norm");
  auto [grad_x, grad_weight] =
      rms_norm_backward(grad_outputs[0].contiguous(), saved.normed, saved.weight32, saved.rstd);
  return {grad_x, grad_weight.to(saved.weight_dtype)};
}

std::pair<at::Tensor, at::Tensor> add_rms_norm_output_gradients(const SavedRmsNorm& saved,
                                                                const variable_list& grad_outputs) {
  const at::Tensor& grad_h = grad_outputs[0];
  const at::Tensor& grad_y = grad_outputs[1];
  // h alone was used: the norm's output gradient is zero.
  return {grad_h.defined() ? grad_h.contiguous() : grad_h,
          grad_y.defined() ? grad_y.contiguous()
                           : at::zeros(saved.normed.sizes(), saved.normed.options().dtype(saved.out_dtype))};
}

variable_list add_rms_norm_gradients(AutogradContext* context, const variable_list& grad_outputs) {
  const SavedRmsNorm saved = saved_rms_norm(context, "add_rms_norm");
  const auto [grad_h, grad_y] = add_rms_norm_output_gradients(saved, grad_outputs);
  auto [grad_x, grad_delta, grad_weight] =
      add_rms_norm_backward(grad_y, grad_h, saved.normed, saved.weight32, saved.rstd);
  return {grad_x, grad_delta, grad_weight.to(saved.weight_dtype)};
}
#endif

}  // namespace detail

namespace {

/// The reference: ATen's ops, op for op what PyTorch's LLaMA runs.
at::Tensor rms_norm_aten(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor x32 = x.to(at::kFloat);
  const at::Tensor normed = x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (normed * weight.to(at::kFloat)).to(x.scalar_type());
}

#ifdef DDP_WITH_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct FusedRmsNorm : torch::autograd::Function<FusedRmsNorm> {
  static at::Tensor forward(AutogradContext* context, const at::Tensor& x, const at::Tensor& weight, double eps,
                            c10::ScalarType out_dtype) {
    // The output is a tensor of its own, not a view, so that callers may
    // modify it in place as they may the ATen version's.
    const at::Tensor input = x.contiguous();
    const at::Tensor weight32 = weight.to(at::kFloat).contiguous();
    auto [y, rstd] = detail::rms_norm_forward(input, weight32, eps, out_dtype);
    detail::save_rms_norm_for_backward(context, input, weight32, rstd, weight.scalar_type(), out_dtype);
    return y;
  }

  static variable_list backward(AutogradContext* context, variable_list grad_outputs) {
    variable_list grads = detail::rms_norm_gradients(context, grad_outputs);  // x, weight
    grads.resize(4);                                                          // eps, out_dtype: none
    return grads;
  }
};

struct FusedAddRmsNorm : torch::autograd::Function<FusedAddRmsNorm> {
  static variable_list forward(AutogradContext* context, const at::Tensor& x, const at::Tensor& delta,
                               const at::Tensor& weight, double eps, c10::ScalarType out_dtype) {
    return detail::add_rms_norm_forward_saved(context, x, delta, weight.to(at::kFloat).contiguous(),
                                              weight.scalar_type(), eps, out_dtype);
  }

  static variable_list backward(AutogradContext* context, variable_list grad_outputs) {
    variable_list grads = detail::add_rms_norm_gradients(context, grad_outputs);  // x, delta, weight
    grads.resize(5);                                                              // eps, out_dtype: none
    return grads;
  }
};
#endif

}  // namespace

bool rms_norm_kernels_built() {
#ifdef DDP_WITH_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, const RMSNormOptions& options) {
#ifdef DDP_WITH_CUDA_KERNELS
  if (const auto out_dtype = detail::fused_rms_norm_dtype(x, weight, options)) {
    return FusedRmsNorm::apply(x, weight, options.eps(), *out_dtype);
  }
#endif
  return rms_norm_aten(x, weight, options.eps());
}

std::pair<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                                               const RMSNormOptions& options) {
#ifdef DDP_WITH_CUDA_KERNELS
  const auto out_dtype = detail::fused_rms_norm_dtype(x, weight, options);
  if (out_dtype && delta.sizes() == x.sizes() && delta.scalar_type() == *out_dtype && delta.device() == x.device()) {
    const auto outputs = FusedAddRmsNorm::apply(x, delta, weight, options.eps(), *out_dtype);
    return {outputs[0], outputs[1]};
  }
#endif
  at::Tensor h = x + delta;
  at::Tensor normed = rms_norm(h, weight, options);
  return {std::move(h), std::move(normed)};
}

}  // namespace ddp
