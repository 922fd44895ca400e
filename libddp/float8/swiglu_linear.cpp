// float8::swiglu_linear: SwiGLU that writes the FP8 casts its neighbours
// read. Forward writes the input of the layer after it (`down`); backward
// the gradients of the outputs of the layers before it (`gate_layer` and
// `up_layer`, or the one `gate_up_layer` that computes both). Each returns
// a placeholder that only that layer may take (TensorScaling::offer), so
// none of these tensors exists in bf16.

#include <ddp/float8.h>

#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>

#include <ddp/errors.h>

#include "float8/kernels.h"
#include "float8/linear_state.h"

namespace ddp {
namespace detail {
namespace {

#ifdef DDP_WITH_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// The [rows, cols] matrices of gate and up: two tensors of one shape, or
/// (up undefined) the column halves of one [..., 2 cols] tensor.
std::pair<at::Tensor, at::Tensor> gate_and_up_matrices(const at::Tensor& gate, const at::Tensor& up) {
  if (up.defined()) {
    const int64_t cols = gate.size(-1);
    return {gate.view({-1, cols}), up.view({-1, cols})};
  }
  const int64_t cols = gate.size(-1) / 2;
  const at::Tensor both = gate.view({-1, 2 * cols});
  return {both.narrow(1, 0, cols), both.narrow(1, cols, cols)};
}

/// The cast of a [rows, 2 cols] matrix as the casts of its column halves:
/// one scale and amax, each half's transpose a row range of the transpose.
std::pair<Float8Tensor, Float8Tensor> halves_of(const Float8Tensor& whole) {
  const int64_t cols = whole.data.size(1) / 2;
  Float8Tensor first = whole, second = whole;
  first.data = whole.data.narrow(1, 0, cols);
  second.data = whole.data.narrow(1, cols, cols);
  first.transposed = whole.transposed.narrow(0, 0, cols);
  second.transposed = whole.transposed.narrow(0, cols, cols);
  return {first, second};
}

/// Forward of the two Functions below: SwiGLU of gate and up (or, up
/// undefined, of gate's halves) written as down's FP8 input, offered to it.
at::Tensor swiglu_to_float8_forward(AutogradContext* context, const at::Tensor& gate, const at::Tensor& up,
                                    TensorScaling* down_input, TensorScaling* gate_grad, TensorScaling* up_grad) {
  const at::Tensor g = gate.contiguous();
  const at::Tensor u = up.defined() ? up.contiguous() : at::Tensor();
  context->save_for_backward(u.defined() ? std::vector<at::Tensor>{g, u} : std::vector<at::Tensor>{g});
  if (gate_grad != nullptr) gate_grad->save_to(context, "gate_grad.");
  if (up_grad != nullptr) up_grad->save_to(context, "up_grad.");
  const auto [gate_rows, up_rows] = gate_and_up_matrices(g, u);
  Float8Tensor y = down_input->destination(gate_rows.size(0), gate_rows.size(1));
  swiglu_to_float8(gate_rows, up_rows, y);
  at::DimVector sizes(g.sizes());
  sizes.back() = gate_rows.size(1);
  return down_input->offer(y, sizes, g.scalar_type());
}

/// Their backward: the placeholders of the FP8 gradients offered to the
/// layers before, one per tensor forward was given.
variable_list swiglu_to_float8_backward(AutogradContext* context, const variable_list& grad_outputs) {
  // The kernel is not recorded by autograd: gradients of these gradients
  // would silently be missing. Refuse, as Python's once_differentiable does.
  TORCH_CHECK(!at::GradMode::is_enabled(),
              "ddp::float8::swiglu_linear: the fused backward cannot be "
              "differentiated again (create_graph); call it with the layers' FP8 off for higher-order gradients");
  const auto saved = context->get_saved_variables();
  const bool halves = saved.size() == 1;
  const at::Tensor grad_y = grad_outputs[0].contiguous();
  const auto [gate_rows, up_rows] = gate_and_up_matrices(saved[0], halves ? at::Tensor() : saved[1]);
  const at::Tensor grad_rows = grad_y.view({-1, grad_y.size(-1)});
  TensorScaling gate_grad = TensorScaling::load_from(context, "gate_grad.");
  if (halves) {
    // One cast of both gradients, in the layout of the one output they are of.
    Float8Tensor grad_both = gate_grad.destination(grad_rows.size(0), 2 * grad_rows.size(1));
    auto [grad_gate, grad_up] = halves_of(grad_both);
    swiglu_gradients_to_float8(grad_rows, gate_rows, up_rows, grad_gate, grad_up);
    return {gate_grad.offer(grad_both, saved[0].sizes(), grad_y.scalar_type())};
  }
  TensorScaling up_grad = TensorScaling::load_from(context, "up_grad.");
  Float8Tensor grad_gate = gate_grad.destination(grad_rows.size(0), grad_rows.size(1));
  Float8Tensor grad_up = up_grad.destination(grad_rows.size(0), grad_rows.size(1));
  swiglu_gradients_to_float8(grad_rows, gate_rows, up_rows, grad_gate, grad_up);
  return {gate_grad.offer(grad_gate, grad_y.sizes(), grad_y.scalar_type()),
          up_grad.offer(grad_up, grad_y.sizes(), grad_y.scalar_type())};
}

struct SwigluToFloat8Function : torch::autograd::Function<SwigluToFloat8Function> {
  /// gate_grad and up_grad: null where backward is not needed.
  static at::Tensor forward(AutogradContext* context, const at::Tensor& gate, const at::Tensor& up,
                            TensorScaling* down_input, TensorScaling* gate_grad, TensorScaling* up_grad) {
    return swiglu_to_float8_forward(context, gate, up, down_input, gate_grad, up_grad);
  }
  static variable_list backward(AutogradContext* context, variable_list grad_outputs) {
    const auto grads = swiglu_to_float8_backward(context, grad_outputs);
    return {grads[0], grads[1], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

/// The same for the halves of one tensor: autograd takes no undefined input.
struct SwigluHalvesToFloat8Function : torch::autograd::Function<SwigluHalvesToFloat8Function> {
  /// gate_up_grad: null where backward is not needed.
  static at::Tensor forward(AutogradContext* context, const at::Tensor& gate_up, TensorScaling* down_input,
                            TensorScaling* gate_up_grad) {
    return swiglu_to_float8_forward(context, gate_up, at::Tensor(), down_input, gate_up_grad, nullptr);
  }
  static variable_list backward(AutogradContext* context, variable_list grad_outputs) {
    return {swiglu_to_float8_backward(context, grad_outputs)[0], at::Tensor(), at::Tensor()};
  }
};

/// Whether the fused kernels take gate and up ([rows, cols] each);
/// `down`'s FP8 matmul needs rows in multiples of 16 (else it refuses its
/// input, and no cast may be left waiting for it).
bool fits_swiglu_kernel(const at::Tensor& gate, const at::Tensor& up) {
  const c10::ScalarType dtype = gate.scalar_type();
  return gate.is_cuda() && (dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf) &&
         up.scalar_type() == dtype && gate.sizes() == up.sizes() && gate.device() == up.device() && gate.dim() >= 1 &&
         gate.numel() > 0 && gate.numel() / gate.size(-1) % 16 == 0;
}

/// The output of down(swiglu) with the fused kernels, or undefined where the
/// layers cannot take them. up undefined: gate holds both, as above.
at::Tensor fused_swiglu_linear(const at::Tensor& gate, const at::Tensor& up, Float8LinearImpl& down,
                               Float8LinearImpl& gate_layer, Float8LinearImpl* up_layer) {
  TensorScaling* down_input = Float8LinearAccess::fusable_input_scaling(down, gate.device());
  const bool backward = at::GradMode::is_enabled() && (gate.requires_grad() || (up.defined() && up.requires_grad()));
  TensorScaling* gate_grad = backward ? Float8LinearAccess::fusable_grad_output_scaling(gate_layer) : nullptr;
  TensorScaling* up_grad =
      backward && up_layer != nullptr ? Float8LinearAccess::fusable_grad_output_scaling(*up_layer) : nullptr;
  // Backward writes both gradients in one kernel, and an offered cast must
  // be taken by its layer: so both layers must take theirs.
  const bool gradients_fused = gate.requires_grad() && gate_grad != nullptr &&
                               (up_layer == nullptr || (up.requires_grad() && up_grad != nullptr));
  if (down_input == nullptr || (backward && !gradients_fused)) return {};
  if (!up.defined()) return down.forward(SwigluHalvesToFloat8Function::apply(gate, down_input, gate_grad));
  return down.forward(SwigluToFloat8Function::apply(gate, up, down_input, gate_grad, up_grad));
}
#endif

}  // namespace
}  // namespace detail

at::Tensor float8::swiglu_linear(const at::Tensor& gate, const at::Tensor& up, Float8LinearImpl& down,
                                 [[maybe_unused]] Float8LinearImpl& gate_layer,
                                 [[maybe_unused]] Float8LinearImpl& up_layer,
                                 const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& swiglu) {
#ifdef DDP_WITH_CUDA_KERNELS
  if (detail::fits_swiglu_kernel(gate, up)) {
    at::Tensor output = detail::fused_swiglu_linear(gate, up, down, gate_layer, &up_layer);
    if (output.defined()) return output;
  }
#endif
  return down.forward(swiglu ? swiglu(gate, up) : at::silu(gate) * up);
}

at::Tensor float8::swiglu_linear(const at::Tensor& gate_up, Float8LinearImpl& down,
                                 [[maybe_unused]] Float8LinearImpl& gate_up_layer,
                                 const std::function<at::Tensor(const at::Tensor&)>& swiglu) {
  if (gate_up.dim() < 1 || gate_up.size(-1) % 2 != 0) {
    throw UsageError(fmt::format(
        "ddp::float8::swiglu_linear: gate_up must be [..., 2 * hidden], gate in its first half and up in its second; "
        "got [{}]",
        fmt::join(gate_up.sizes(), ", ")));
  }
#ifdef DDP_WITH_CUDA_KERNELS
  const int64_t hidden = gate_up.size(-1) / 2;
  if (hidden > 0 && detail::fits_swiglu_kernel(gate_up.narrow(-1, 0, hidden), gate_up.narrow(-1, hidden, hidden))) {
    at::Tensor output = detail::fused_swiglu_linear(gate_up, at::Tensor(), down, gate_up_layer, nullptr);
    if (output.defined()) return output;
  }
#endif
  if (swiglu) return down.forward(swiglu(gate_up));
  const auto halves = gate_up.chunk(2, -1);
  return down.forward(at::silu(halves[0]) * halves[1]);
}

}  // namespace ddp
