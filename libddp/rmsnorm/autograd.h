#pragma once

// The pieces of ddp::rms_norm's fused path that another autograd function
// running the same norm reuses (float8::rms_norm, whose forward writes the
// norm as its layer's FP8 input and whose backward is this one): the choice
// of the path, what forward saves, and the gradients of the backward
// kernels. save_rms_norm_for_backward and the gradients are defined only
// where the kernels are compiled (DDP_WITH_CUDA_KERNELS).

#include <optional>
#include <utility>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>

#include <ddp/rms_norm.h>

namespace ddp::detail {

/// The dtype the fused RMSNorm of x returns (x's, or under CUDA autocast an
/// fp32 x's autocast dtype), or nullopt where the fused path does not run
/// (options.fused() off, no kernels built, a tensor the kernels do not take).
std::optional<c10::ScalarType> fused_rms_norm_dtype(const at::Tensor& x, const at::Tensor& weight,
                                                    const RMSNormOptions& options);

/// Saves what rms_norm_gradients and add_rms_norm_gradients read: the
/// norm's input `normed` (x, or the sum x + delta), contiguous, the fp32
/// weight, the per-row rsqrt the forward kernel wrote, the weight's own
/// dtype (its gradient's) and the dtype the norm returned.
void save_rms_norm_for_backward(torch::autograd::AutogradContext* context, const at::Tensor& normed,
                                const at::Tensor& weight32, const at::Tensor& rstd, c10::ScalarType weight_dtype,
                                c10::ScalarType out_dtype);

/// ddp::add_rms_norm's fused forward: {h, y} from add_rms_norm_forward of
/// x + delta with the fp32 weight `weight32` (whose own dtype is
/// `weight_dtype`), saved for backward as save_rms_norm_for_backward says.
torch::autograd::variable_list add_rms_norm_forward_saved(torch::autograd::AutogradContext* context,
                                                          const at::Tensor& x, const at::Tensor& delta,
                                                          const at::Tensor& weight32, c10::ScalarType weight_dtype,
                                                          double eps, c10::ScalarType out_dtype);

/// What save_rms_norm_for_backward saved, for a backward of its own (the
/// FP8 one of float8::add_rms_norm). Throws under create_graph, naming `op`:
/// the kernels' backward is not differentiable.
struct SavedRmsNorm {
  at::Tensor normed, weight32, rstd;
  c10::ScalarType weight_dtype, out_dtype;
};
SavedRmsNorm saved_rms_norm(torch::autograd::AutogradContext* context, const char* op);

/// add_rms_norm's output gradients {grad_h, grad_y} as its backward kernels
/// take them, contiguous: grad_h undefined where the sum got none, grad_y
/// zeros where the sum alone was used.
std::pair<at::Tensor, at::Tensor> add_rms_norm_output_gradients(const SavedRmsNorm& saved,
                                                                const torch::autograd::variable_list& grad_outputs);

/// {grad_x, grad_weight} from the norm's output gradient grad_outputs[0].
/// Throws under create_graph: the kernels' backward is not differentiable.
torch::autograd::variable_list rms_norm_gradients(torch::autograd::AutogradContext* context,
                                                  const torch::autograd::variable_list& grad_outputs);

/// {grad_x, grad_delta, grad_weight} from grad_outputs {grad_h, grad_y} (the
/// sum's and the norm's, either undefined where unused). Throws under
/// create_graph.
torch::autograd::variable_list add_rms_norm_gradients(torch::autograd::AutogradContext* context,
                                                      const torch::autograd::variable_list& grad_outputs);

}  // namespace ddp::detail
