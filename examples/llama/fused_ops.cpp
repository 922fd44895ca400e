#include "fused_ops.h"

#include <torch/autograd.h>
#include <torch/torch.h>

#include "compat/torch_compat.h"

#if LLAMA_WITH_CUDA_KERNELS
#include "fused_kernels.h"
#endif

namespace llama::ops {
namespace {

torch::Tensor rms_norm_aten(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const torch::Tensor x32 = x.to(torch::kFloat);
  const torch::Tensor normed = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (normed * weight.to(torch::kFloat)).to(x.scalar_type());
}

torch::Tensor rotate_pairs_aten(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const std::int64_t seq = x.size(1);
  const torch::Tensor pairs = x.to(torch::kFloat).reshape({x.size(0), seq, x.size(2), -1, 2});
  const torch::Tensor even = pairs.select(-1, 0);
  const torch::Tensor odd = pairs.select(-1, 1);
  const torch::Tensor c = cos.view({1, seq, 1, -1});
  const torch::Tensor s = sin.view({1, seq, 1, -1});
  return torch::stack({even * c - odd * s, even * s + odd * c}, -1).flatten(-2).to(x.scalar_type());
}

#if LLAMA_WITH_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool kernel_dtype(const torch::Tensor& t) {
  const auto dtype = t.scalar_type();
  return dtype == torch::kFloat || dtype == torch::kBFloat16 || dtype == torch::kHalf;
}

struct FusedRmsNorm : torch::autograd::Function<FusedRmsNorm> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight, double eps,
                               c10::ScalarType out_dtype) {
    const torch::Tensor rows = x.contiguous().view({-1, x.size(-1)});
    const torch::Tensor weight32 = weight.to(torch::kFloat).contiguous();
    auto [y, rstd] = kernels::rms_norm_forward(rows, weight32, eps, out_dtype);
    ctx->save_for_backward({rows, weight32, rstd});
    ctx->saved_data["weight_dtype"] = weight.scalar_type();
    return y.view(x.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& rows = saved[0];
    const torch::Tensor grad = grad_outputs[0];
    auto [grad_x, grad_weight] =
        kernels::rms_norm_backward(grad.contiguous().view(rows.sizes()), rows, saved[1], saved[2]);
    return {grad_x.view(grad.sizes()), grad_weight.to(ctx->saved_data["weight_dtype"].toScalarType()),
            torch::Tensor(), torch::Tensor()};
  }
};

struct FusedRotation : torch::autograd::Function<FusedRotation> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return kernels::rotate_pairs(x.contiguous(), cos, sin, /*inverse=*/false);
  }

  // A rotation's gradient is the rotation by the opposite angles.
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    return {kernels::rotate_pairs(grad_outputs[0].contiguous(), saved[0], saved[1], /*inverse=*/true),
            torch::Tensor(), torch::Tensor()};
  }
};

struct FusedSwiglu : torch::autograd::Function<FusedSwiglu> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& gate, const torch::Tensor& up) {
    const torch::Tensor g = gate.contiguous();
    const torch::Tensor u = up.contiguous();
    ctx->save_for_backward({g, u});
    return kernels::swiglu_forward(g, u);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    auto [grad_gate, grad_up] = kernels::swiglu_backward(grad_outputs[0].contiguous(), saved[0], saved[1]);
    return {grad_gate, grad_up};
  }
};
#endif

}  // namespace

bool fused_kernels_built() { return LLAMA_WITH_CUDA_KERNELS != 0; }

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps, [[maybe_unused]] bool fused) {
#if LLAMA_WITH_CUDA_KERNELS
  if (fused && x.is_cuda() && kernel_dtype(x) && x.dim() >= 1 && weight.dim() == 1 && weight.size(0) == x.size(-1)) {
    c10::ScalarType out_dtype = x.scalar_type();
    if (out_dtype == torch::kFloat && ddp::compat::autocast_enabled(c10::DeviceType::CUDA)) {
      out_dtype = ddp::compat::autocast_dtype(c10::DeviceType::CUDA);
    }
    return FusedRmsNorm::apply(x, weight, eps, out_dtype);
  }
#endif
  return rms_norm_aten(x, weight, eps);
}

torch::Tensor rotate_pairs(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                           [[maybe_unused]] bool fused) {
#if LLAMA_WITH_CUDA_KERNELS
  if (fused && x.is_cuda() && kernel_dtype(x) && x.dim() == 4 && x.size(3) % 2 == 0 && x.storage_offset() % 2 == 0 &&
      cos.scalar_type() == torch::kFloat && cos.is_contiguous() && sin.is_contiguous() &&
      cos.sizes() == torch::IntArrayRef({x.size(1), x.size(3) / 2}) && sin.sizes() == cos.sizes()) {
    return FusedRotation::apply(x, cos, sin);
  }
#endif
  return rotate_pairs_aten(x, cos, sin);
}

torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up, [[maybe_unused]] bool fused) {
#if LLAMA_WITH_CUDA_KERNELS
  if (fused && gate.is_cuda() && kernel_dtype(gate) && gate.scalar_type() == up.scalar_type() &&
      gate.sizes() == up.sizes() && gate.device() == up.device()) {
    return FusedSwiglu::apply(gate, up);
  }
#endif
  return torch::silu(gate) * up;
}

}  // namespace llama::ops
