// float8::rms_norm and float8::add_rms_norm: the norm of a pre-norm block
// writing the FP8 cast of the one layer that reads its output (the offer of
// TensorScaling, as swiglu_linear's forward does for `down`), so that the
// norm's bf16 output and the cast's second pass over it do not exist.
// Backward is ddp::rms_norm's: it reads the norm's input and the gradient
// the layer returns, never the output.

#include <ddp/float8.h>

#include <cstdint>
#include <utility>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <ddp/precision.h>
#include <ddp/rms_norm.h>

#include "cuda/alignment.h"
#include "float8/kernels.h"
#include "float8/linear_state.h"
#include "rmsnorm/autograd.h"

namespace ddp {
namespace detail {
namespace {

#ifdef DDP_WITH_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// The norm of x (+ delta) written as `input_scaling`'s cast, offered to its
/// layer; with delta, also the sum x + delta. Saves for backward what
/// ddp::rms_norm's fused path saves.
variable_list norm_to_float8_forward(AutogradContext* context, const at::Tensor& x, const at::Tensor& delta,
                                     const at::Tensor& weight, double eps, c10::ScalarType out_dtype,
                                     TensorScaling* input_scaling) {
  const int64_t cols = x.size(-1);
  const at::Tensor rows = x.contiguous().view({-1, cols});
  at::Tensor weight32 = weight.to(at::kFloat).contiguous();
  // The kernel reads 16-byte packs of it: a weight at another offset (a
  // slice, a parameter inside a flat buffer) is read from an aligned copy.
  if (!aligned(weight32.data_ptr(), 16)) weight32 = weight32.clone();
  const bool residual = delta.defined();
  // A tensor of its own in x's shape, not a view made in here: autograd
  // refuses in-place changes to a custom function's view outputs, and
  // ddp::add_rms_norm's h may be changed in place.
  const at::Tensor sum = residual ? at::empty(x.sizes(), rows.options()) : at::Tensor();
  const at::Tensor rstd = at::empty({rows.size(0)}, rows.options().dtype(at::kFloat));
  Float8Tensor y = input_scaling->destination(rows.size(0), cols);
  rms_norm_to_float8(rows, residual ? delta.contiguous().view({-1, cols}) : at::Tensor(), weight32, eps, out_dtype,
                     residual ? sum.view({-1, cols}) : at::Tensor(), rstd, y);
  save_rms_norm_for_backward(context, residual ? sum : rows.view(x.sizes()), weight32, rstd, weight.scalar_type(),
                             out_dtype);
  const at::Tensor placeholder = input_scaling->offer(y, x.sizes(), out_dtype);
  if (!residual) return {placeholder};
  return {sum, placeholder};
}

struct RmsNormToFloat8Function : torch::autograd::Function<RmsNormToFloat8Function> {
  static at::Tensor forward(AutogradContext* context, const at::Tensor& x, const at::Tensor& weight, double eps,
                            c10::ScalarType out_dtype, TensorScaling* input_scaling) {
    return norm_to_float8_forward(context, x, at::Tensor(), weight, eps, out_dtype, input_scaling)[0];
  }
  static variable_list backward(AutogradContext* context, variable_list grad_outputs) {
    variable_list grads = rms_norm_gradients(context, grad_outputs);  // x, weight
    grads.resize(5);
    return grads;
  }
};

struct AddRmsNormToFloat8Function : torch::autograd::Function<AddRmsNormToFloat8Function> {
  static variable_list forward(AutogradContext* context, const at::Tensor& x, const at::Tensor& delta,
                               const at::Tensor& weight, double eps, c10::ScalarType out_dtype,
                               TensorScaling* input_scaling) {
    return norm_to_float8_forward(context, x, delta, weight, eps, out_dtype, input_scaling);
  }
  static variable_list backward(AutogradContext* context, variable_list grad_outputs) {
    variable_list grads = add_rms_norm_gradients(context, grad_outputs);  // x, delta, weight
    grads.resize(6);
    return grads;
  }
};

/// `layer`'s input scaling where the norm of x can write the layer's cast,
/// with the dtype the norm returns; null elsewhere (the unfused norm runs).
std::pair<TensorScaling*, c10::ScalarType> fusable(const at::Tensor& x, const at::Tensor& delta,
                                                   const at::Tensor& weight, Float8LinearImpl& layer,
                                                   const RMSNormOptions& options) {
  const std::optional<c10::ScalarType> out_dtype = fused_rms_norm_dtype(x, weight, options);
  // A layer sharing its input cast with others (float8::share_input_cast)
  // would hand them the placeholder, which holds no values: not fused.
  // The layer must take the cast: a width it refuses would leave it waiting.
  if (!out_dtype || Float8LinearAccess::shared_input(layer) != nullptr || x.size(-1) != layer.options.in_features() ||
      (delta.defined() &&
       (delta.sizes() != x.sizes() || delta.scalar_type() != *out_dtype || delta.device() != x.device())) ||
      !rms_norm_to_float8_takes(x, delta)) {
    return {nullptr, at::kFloat};
  }
  return {Float8LinearAccess::fusable_input_scaling(layer, x.device()), *out_dtype};
}
#endif

}  // namespace
}  // namespace detail

at::Tensor float8::rms_norm(const at::Tensor& x, const at::Tensor& weight, [[maybe_unused]] Float8LinearImpl& layer,
                            const RMSNormOptions& options) {
#ifdef DDP_WITH_CUDA_KERNELS
  if (const auto [scaling, out_dtype] = detail::fusable(x, at::Tensor(), weight, layer, options); scaling != nullptr) {
    return detail::RmsNormToFloat8Function::apply(x, weight, options.eps(), out_dtype, scaling);
  }
#endif
  return ddp::rms_norm(x, weight, options);
}

std::pair<at::Tensor, at::Tensor> float8::add_rms_norm(const at::Tensor& x, const at::Tensor& delta,
                                                       const at::Tensor& weight,
                                                       [[maybe_unused]] Float8LinearImpl& layer,
                                                       const RMSNormOptions& options) {
#ifdef DDP_WITH_CUDA_KERNELS
  if (const auto [scaling, out_dtype] = detail::fusable(x, delta, weight, layer, options); scaling != nullptr) {
    const auto outputs = detail::AddRmsNormToFloat8Function::apply(x, delta, weight, options.eps(), out_dtype, scaling);
    return {outputs[0], outputs[1]};
  }
#endif
  return ddp::add_rms_norm(x, delta, weight, options);
}

}  // namespace ddp
