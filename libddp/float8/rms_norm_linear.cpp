// float8::rms_norm and float8::add_rms_norm: the norm of a pre-norm block
// writing the FP8 cast of the one layer that reads its output (the offer of
// TensorScaling, as swiglu_linear's forward does for `down`), or of the
// layers that share that layer's input cast (SwiGLU's gate and up), so that
// the norm's bf16 output and the cast's second pass over it do not exist.
// Backward reads the norm's input and the gradient the layer returns, never
// the output; add_rms_norm's backward also writes the gradient of delta as
// the FP8 output gradient of the layer that computed delta, as swiglu_linear's
// backward does for gate and up.

#include <ddp/float8.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <ddp/precision.h>
#include <ddp/rms_norm.h>

#include "cuda/alignment.h"
#include "float8/input_sharing.h"
#include "float8/kernels.h"
#include "float8/linear_state.h"
#include "rmsnorm/autograd.h"

namespace ddp {
namespace detail {
namespace {

#ifdef DDP_WITH_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// The norm's weight in fp32, 16-byte aligned: the kernels read 16-byte packs
/// of it, and a weight at another offset (a slice, a parameter inside a flat
/// buffer) is read from an aligned copy.
at::Tensor aligned_fp32_weight(const at::Tensor& weight) {
  const at::Tensor weight32 = weight.to(at::kFloat).contiguous();
  return aligned(weight32.data_ptr(), 16) ? weight32 : weight32.clone();
}

/// The norm of x (+ delta) written as the cast of `reader`'s input, offered to
/// it (and to the layers sharing its input cast); with delta, also the sum
/// x + delta. Saves for backward what ddp::rms_norm's fused path saves.
variable_list norm_to_float8_forward(AutogradContext* context, const at::Tensor& x, const at::Tensor& delta,
                                     const at::Tensor& weight, double eps, c10::ScalarType out_dtype,
                                     Float8LinearImpl* reader) {
  TensorScaling* const input_scaling = Float8LinearAccess::fusable_input_scaling(*reader, x.device());
  const int64_t cols = x.size(-1);
  const at::Tensor rows = x.contiguous().view({-1, cols});
  const at::Tensor weight32 = aligned_fp32_weight(weight);
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
  if (SharedInputCast* group = Float8LinearAccess::shared_input(*reader).get()) {
    group->expect(placeholder, y, Float8LinearAccess::state(*reader));
  }
  if (!residual) return {placeholder};
  return {sum, placeholder};
}

struct RmsNormToFloat8Function : torch::autograd::Function<RmsNormToFloat8Function> {
  static at::Tensor forward(AutogradContext* context, const at::Tensor& x, const at::Tensor& weight, double eps,
                            c10::ScalarType out_dtype, Float8LinearImpl* reader) {
    return norm_to_float8_forward(context, x, at::Tensor(), weight, eps, out_dtype, reader)[0];
  }
  static variable_list backward(AutogradContext* context, variable_list grad_outputs) {
    variable_list grads = rms_norm_gradients(context, grad_outputs);  // x, weight
    grads.resize(5);
    return grads;
  }
};

/// float8::add_rms_norm: forward writes the norm as `reader`'s input cast
/// (null: in out_dtype, as ddp::add_rms_norm), backward the gradient of delta
/// as `delta_grad_scaling`'s (null: in out_dtype).
struct AddRmsNormFloat8Function : torch::autograd::Function<AddRmsNormFloat8Function> {
  static variable_list forward(AutogradContext* context, const at::Tensor& x, const at::Tensor& delta,
                               const at::Tensor& weight, double eps, c10::ScalarType out_dtype,
                               Float8LinearImpl* reader, TensorScaling* delta_grad_scaling) {
    context->saved_data["delta_grad_fused"] = delta_grad_scaling != nullptr;
    if (delta_grad_scaling != nullptr) delta_grad_scaling->save_to(context, "delta_grad.");
    if (reader != nullptr) return norm_to_float8_forward(context, x, delta, weight, eps, out_dtype, reader);
    return add_rms_norm_forward_saved(context, x, delta, aligned_fp32_weight(weight), weight.scalar_type(), eps,
                                      out_dtype);
  }

  static variable_list backward(AutogradContext* context, variable_list grad_outputs) {
    if (!context->saved_data["delta_grad_fused"].toBool()) {
      variable_list grads = add_rms_norm_gradients(context, grad_outputs);  // x, delta, weight
      grads.resize(7);
      return grads;
    }
    const SavedRmsNorm saved = saved_rms_norm(context, "float8::add_rms_norm");
    const at::Tensor& h = saved.normed;
    const auto [grad_h, grad_y] = add_rms_norm_output_gradients(saved, grad_outputs);
    const int64_t cols = h.size(-1);
    TensorScaling delta_grad = TensorScaling::load_from(context, "delta_grad.");
    Float8Tensor grad_delta = delta_grad.destination(h.numel() / cols, cols);
    auto [grad_x, grad_weight] =
        add_rms_norm_backward_to_float8(grad_y, grad_h, h, saved.weight32, saved.rstd, grad_delta);
    return {grad_x,
            delta_grad.offer(grad_delta, h.sizes(), saved.out_dtype),
            grad_weight.to(saved.weight_dtype),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

/// Whether every layer that reads `layer`'s input through a shared cast
/// (float8::share_input_cast; none: true) would take the norm's cast on
/// `device`: each runs FP8 with delayed scaling, so that it casts through
/// the group and finds the cast there. One that ran in bf16 would read the
/// placeholder's values, which it does not hold. Under inference mode the
/// group casts every input anew (inference tensors have no version), so it
/// is never fused there.
bool group_takes_the_cast(Float8LinearImpl& layer, const c10::Device& device) {
  SharedInputCast* group = Float8LinearAccess::shared_input(layer).get();
  if (group == nullptr) return true;
  if (c10::InferenceMode::is_enabled()) return false;
  const std::vector<std::shared_ptr<Float8LinearImpl>> members = group->layers();
  return !members.empty() && std::all_of(members.begin(), members.end(), [&](const auto& member) {
    return Float8LinearAccess::fusable_input_scaling(*member, device) != nullptr;
  });
}

/// The dtype the norm returns where the norm of x can write `layer`'s input
/// cast; nullopt elsewhere (the unfused norm runs).
std::optional<c10::ScalarType> fusable(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                                       Float8LinearImpl& layer, const RMSNormOptions& options) {
  const std::optional<c10::ScalarType> out_dtype = fused_rms_norm_dtype(x, weight, options);
  // The layer must take the cast: a width it refuses would leave it waiting.
  if (!out_dtype || x.size(-1) != layer.options.in_features() ||
      (delta.defined() &&
       (delta.sizes() != x.sizes() || delta.scalar_type() != *out_dtype || delta.device() != x.device())) ||
      !rms_norm_to_float8_takes(x, delta) || Float8LinearAccess::fusable_input_scaling(layer, x.device()) == nullptr ||
      !group_takes_the_cast(layer, x.device())) {
    return std::nullopt;
  }
  return out_dtype;
}

/// The dtype of delta's gradient where backward can write it as the FP8
/// output gradient of `delta_layer` (the layer that computed delta: its
/// output gradient under delayed scaling, as wide as x, needed); nullopt
/// where the gradient is written unfused.
std::optional<c10::ScalarType> fused_delta_gradient_dtype(const at::Tensor& x, const at::Tensor& delta,
                                                          const at::Tensor& weight, Float8LinearImpl& delta_layer,
                                                          const RMSNormOptions& options) {
  const std::optional<c10::ScalarType> out_dtype = fused_rms_norm_dtype(x, weight, options);
  if (!out_dtype || !at::GradMode::is_enabled() || !delta.requires_grad() || delta.sizes() != x.sizes() ||
      delta.scalar_type() != *out_dtype || delta.device() != x.device() ||
      x.size(-1) != delta_layer.options.out_features() || !add_rms_norm_backward_to_float8_takes(x) ||
      Float8LinearAccess::fusable_grad_output_scaling(delta_layer) == nullptr) {
    return std::nullopt;
  }
  return out_dtype;
}

/// float8::add_rms_norm where either side fuses; nullopt where neither does.
std::optional<std::pair<at::Tensor, at::Tensor>> fused_add_rms_norm(const at::Tensor& x, const at::Tensor& delta,
                                                                    Float8LinearImpl* delta_layer,
                                                                    const at::Tensor& weight, Float8LinearImpl* layer,
                                                                    const RMSNormOptions& options) {
  Float8LinearImpl* reader = nullptr;
  c10::ScalarType out_dtype = at::kFloat;
  if (layer != nullptr) {
    if (const auto dtype = fusable(x, delta, weight, *layer, options)) {
      reader = layer;
      out_dtype = *dtype;
    }
  }
  TensorScaling* delta_grad_scaling = nullptr;
  if (delta_layer != nullptr) {
    if (const auto dtype = fused_delta_gradient_dtype(x, delta, weight, *delta_layer, options)) {
      delta_grad_scaling = Float8LinearAccess::fusable_grad_output_scaling(*delta_layer);
      out_dtype = *dtype;
    }
  }
  if (reader == nullptr && delta_grad_scaling == nullptr) return std::nullopt;
  const auto outputs =
      AddRmsNormFloat8Function::apply(x, delta, weight, options.eps(), out_dtype, reader, delta_grad_scaling);
  return std::make_pair(outputs[0], outputs[1]);
}
#endif

}  // namespace
}  // namespace detail

at::Tensor float8::rms_norm(const at::Tensor& x, const at::Tensor& weight, [[maybe_unused]] Float8LinearImpl& layer,
                            const RMSNormOptions& options) {
#ifdef DDP_WITH_CUDA_KERNELS
  if (const auto out_dtype = detail::fusable(x, at::Tensor(), weight, layer, options)) {
    return detail::RmsNormToFloat8Function::apply(x, weight, options.eps(), *out_dtype, &layer);
  }
#endif
  return ddp::rms_norm(x, weight, options);
}

std::pair<at::Tensor, at::Tensor> float8::add_rms_norm(const at::Tensor& x, const at::Tensor& delta,
                                                       const at::Tensor& weight, Float8LinearImpl& layer,
                                                       const RMSNormOptions& options) {
  return add_rms_norm(x, delta, nullptr, weight, &layer, options);
}

std::pair<at::Tensor, at::Tensor> float8::add_rms_norm(const at::Tensor& x, const at::Tensor& delta,
                                                       [[maybe_unused]] Float8LinearImpl* delta_layer,
                                                       const at::Tensor& weight,
                                                       [[maybe_unused]] Float8LinearImpl* layer,
                                                       const RMSNormOptions& options) {
#ifdef DDP_WITH_CUDA_KERNELS
  if (auto outputs = detail::fused_add_rms_norm(x, delta, delta_layer, weight, layer, options)) {
    return *std::move(outputs);
  }
#endif
  return ddp::add_rms_norm(x, delta, weight, options);
}

}  // namespace ddp
