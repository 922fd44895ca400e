// float8::swiglu_linear: SwiGLU that writes the FP8 casts its neighbours
// read. Forward writes the input of the layer after it (`down`); backward
// the gradients of the outputs of the layers before it (`gate_layer`,
// `up_layer`). Each returns a placeholder that only that layer may take
// (TensorScaling::offer), so none of the three tensors exists in bf16.

#include <ddp/float8.h>

#include <cstdint>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "float8/kernels.h"
#include "float8/linear_state.h"

namespace ddp {
namespace detail {
namespace {

#ifdef DDP_WITH_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct SwigluToFloat8Function : torch::autograd::Function<SwigluToFloat8Function> {
  /// gate_grad and up_grad: null where backward is not needed.
  static at::Tensor forward(AutogradContext* context, const at::Tensor& gate, const at::Tensor& up,
                            TensorScaling* down_input, TensorScaling* gate_grad, TensorScaling* up_grad) {
    const at::Tensor g = gate.contiguous();
    const at::Tensor u = up.contiguous();
    context->save_for_backward({g, u});
    if (gate_grad != nullptr) {
      gate_grad->save_to(context, "gate_grad.");
      up_grad->save_to(context, "up_grad.");
    }
    const int64_t cols = g.size(-1);
    const int64_t rows = g.numel() / cols;
    Float8Tensor y = down_input->destination(rows, cols);
    swiglu_to_float8(g.view({rows, cols}), u.view({rows, cols}), y);
    return down_input->offer(y, g.sizes(), g.scalar_type());
  }

  static variable_list backward(AutogradContext* context, variable_list grad_outputs) {
    // The kernel is not recorded by autograd: gradients of these gradients
    // would silently be missing. Refuse, as Python's once_differentiable does.
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "ddp::float8::swiglu_linear: the fused backward cannot be "
                "differentiated again (create_graph); call it with the layers' FP8 off for higher-order gradients");
    const auto saved = context->get_saved_variables();
    const at::Tensor grad_y = grad_outputs[0].contiguous();
    TensorScaling gate_grad = TensorScaling::load_from(context, "gate_grad.");
    TensorScaling up_grad = TensorScaling::load_from(context, "up_grad.");
    const int64_t cols = grad_y.size(-1);
    const int64_t rows = grad_y.numel() / cols;
    Float8Tensor grad_gate = gate_grad.destination(rows, cols);
    Float8Tensor grad_up = up_grad.destination(rows, cols);
    swiglu_gradients_to_float8(grad_y.view({rows, cols}), saved[0].view({rows, cols}), saved[1].view({rows, cols}),
                               grad_gate, grad_up);
    return {gate_grad.offer(grad_gate, grad_y.sizes(), grad_y.scalar_type()),
            up_grad.offer(grad_up, grad_y.sizes(), grad_y.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

/// Whether the fused kernels take gate and up; `down`'s FP8 matmul needs rows
/// in multiples of 16 (else it refuses its input, and no cast may be left
/// waiting for it).
bool fits_swiglu_kernel(const at::Tensor& gate, const at::Tensor& up) {
  const c10::ScalarType dtype = gate.scalar_type();
  return gate.is_cuda() && (dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf) &&
         up.scalar_type() == dtype && gate.sizes() == up.sizes() && gate.device() == up.device() && gate.dim() >= 1 &&
         gate.numel() > 0 && gate.numel() / gate.size(-1) % 16 == 0;
}
#endif

}  // namespace
}  // namespace detail

at::Tensor float8::swiglu_linear(const at::Tensor& gate, const at::Tensor& up, Float8LinearImpl& down,
                                 [[maybe_unused]] Float8LinearImpl& gate_layer,
                                 [[maybe_unused]] Float8LinearImpl& up_layer,
                                 const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& swiglu) {
#ifdef DDP_WITH_CUDA_KERNELS
  using detail::Float8LinearAccess;
  if (detail::fits_swiglu_kernel(gate, up)) {
    detail::TensorScaling* down_input = Float8LinearAccess::fusable_input_scaling(down, gate.device());
    const bool backward = at::GradMode::is_enabled() && (gate.requires_grad() || up.requires_grad());
    detail::TensorScaling* gate_grad = backward ? Float8LinearAccess::fusable_grad_output_scaling(gate_layer) : nullptr;
    detail::TensorScaling* up_grad = backward ? Float8LinearAccess::fusable_grad_output_scaling(up_layer) : nullptr;
    // Backward writes both gradients in one kernel, and an offered cast must
    // be taken by its layer: so both layers must take theirs.
    const bool gradients_fused =
        gate.requires_grad() && up.requires_grad() && gate_grad != nullptr && up_grad != nullptr;
    if (down_input != nullptr && (!backward || gradients_fused)) {
      return down.forward(detail::SwigluToFloat8Function::apply(gate, up, down_input, gate_grad, up_grad));
    }
  }
#endif
  return down.forward(swiglu ? swiglu(gate, up) : at::silu(gate) * up);
}

}  // namespace ddp
