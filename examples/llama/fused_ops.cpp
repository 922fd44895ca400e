#include "fused_ops.h"

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include <torch/autograd.h>
#include <torch/torch.h>

#if LLAMA_WITH_CUDA_KERNELS
#include "fused_kernels.h"
#endif

namespace llama::ops {
namespace {

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

/// The backward kernels are not recorded by autograd, so gradients of these
/// gradients would silently be missing: refuse, as Python's
/// once_differentiable does.
void check_not_differentiated_twice(const char* op) {
  TORCH_CHECK(!torch::GradMode::is_enabled(), "llama::ops::", op,
              ": the fused backward cannot be differentiated again (create_graph); build the model with "
              "LlamaConfig::fused_kernels = false for higher-order gradients");
}

// Backward keeps the logits (in their dtype) and one fp32 log-sum-exp per
// row, not ATen's fp32 copy of the logits and their fp32 log-softmax.
struct FusedCrossEntropy : torch::autograd::Function<FusedCrossEntropy> {
  static constexpr int64_t kIgnoreIndex = -100;  // torch::nn::functional::cross_entropy's default

  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits, const torch::Tensor& targets) {
    const torch::Tensor rows = logits.contiguous();
    const torch::Tensor labels = targets.contiguous();
    auto [losses, log_sum_exp] = kernels::cross_entropy_forward(rows, labels, kIgnoreIndex);
    // The mean over the rows not ignored, as ATen's (0 / 0 where all are).
    const torch::Tensor counted = labels.ne(kIgnoreIndex).sum().to(torch::kFloat);
    ctx->save_for_backward({rows, labels, log_sum_exp, counted});
    return losses.sum() / counted;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    check_not_differentiated_twice("cross_entropy");
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor scale = (grad_outputs[0].to(torch::kFloat) / saved[3]).reshape({1});
    return {kernels::cross_entropy_backward(scale, saved[0], saved[1], saved[2], kIgnoreIndex), torch::Tensor()};
  }
};

struct FusedRotation : torch::autograd::Function<FusedRotation> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return kernels::rotate_pairs(x, cos, sin, /*inverse=*/false);
  }

  // A rotation's gradient is the rotation by the opposite angles.
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    check_not_differentiated_twice("rotate_pairs");
    const auto saved = ctx->get_saved_variables();
    return {kernels::rotate_pairs(grad_outputs[0].contiguous(), saved[0], saved[1], /*inverse=*/true),
            torch::Tensor(), torch::Tensor()};
  }
};

struct FusedSplitRotateQkv : torch::autograd::Function<FusedSplitRotateQkv> {
  /// producer: the layer whose output qkv is, or null; it outlives the
  /// backward, as a model's layers do (kept as a number in saved_data).
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& qkv, const torch::Tensor& cos,
                               const torch::Tensor& sin, std::int64_t heads, std::int64_t kv_heads,
                               ddp::Float8LinearImpl* producer) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["producer"] = static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(producer));
    ctx->saved_data["sizes"] = qkv.sizes();
    auto [q, k, v] = kernels::split_rotate_qkv(qkv, cos, sin, heads, kv_heads);
    return {q, k, v};
  }

  // qkv's gradient whole, or, where the producer's backward would cast it to
  // FP8 itself, as that cast (ddp::float8::output_gradient_destination):
  // then neither the bf16 gradient nor the cast's pass over it exists.
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    check_not_differentiated_twice("split_rotate_qkv");
    const auto saved = ctx->get_saved_variables();
    // A part that reached no loss comes as zeros (the context materialises gradients).
    const torch::Tensor grad_q = grad_outputs[0].contiguous(), grad_k = grad_outputs[1].contiguous(),
                        grad_v = grad_outputs[2].contiguous();
    torch::Tensor grad_qkv;
    auto* producer =
        reinterpret_cast<ddp::Float8LinearImpl*>(static_cast<std::intptr_t>(ctx->saved_data["producer"].toInt()));
    const std::vector<std::int64_t> sizes = ctx->saved_data["sizes"].toIntVector();
    std::optional<ddp::Float8Tensor> cast;
    if (producer != nullptr) cast = ddp::float8::output_gradient_destination(*producer, sizes[0] * sizes[1], sizes[2]);
    if (cast) {
      kernels::merge_rotate_qkv_to_float8(grad_q, grad_k, grad_v, saved[0], saved[1], *cast);
      grad_qkv = ddp::float8::output_gradient_written(*producer, *cast, sizes, grad_q.scalar_type());
    } else {
      grad_qkv = kernels::merge_rotate_qkv(grad_q, grad_k, grad_v, saved[0], saved[1]);
    }
    return {grad_qkv, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
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
    check_not_differentiated_twice("swiglu");
    const auto saved = ctx->get_saved_variables();
    auto [grad_gate, grad_up] = kernels::swiglu_backward(grad_outputs[0].contiguous(), saved[0], saved[1]);
    return {grad_gate, grad_up};
  }
};

bool fits_swiglu_kernel(const torch::Tensor& gate, const torch::Tensor& up) {
  return gate.is_cuda() && kernel_dtype(gate) && gate.scalar_type() == up.scalar_type() &&
         gate.sizes() == up.sizes() && gate.device() == up.device();
}
#endif

}  // namespace

bool fused_kernels_built() { return LLAMA_WITH_CUDA_KERNELS != 0; }

torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets, [[maybe_unused]] bool fused) {
#if LLAMA_WITH_CUDA_KERNELS
  if (fused && logits.is_cuda() && kernel_dtype(logits) && logits.dim() == 2 && logits.size(1) > 0 &&
      targets.dim() == 1 && targets.size(0) == logits.size(0) && targets.scalar_type() == torch::kLong &&
      targets.device() == logits.device()) {
    return FusedCrossEntropy::apply(logits, targets);
  }
#endif
  return torch::nn::functional::cross_entropy(logits.to(torch::kFloat), targets);
}

torch::Tensor rotate_pairs(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                           [[maybe_unused]] bool fused) {
#if LLAMA_WITH_CUDA_KERNELS
  // The kernel takes no gradient for the angles: tables that need one take the ATen ops.
  if (fused && x.is_cuda() && kernel_dtype(x) && x.dim() == 4 && x.size(3) % 2 == 0 &&
      cos.scalar_type() == torch::kFloat && sin.scalar_type() == torch::kFloat && cos.device() == x.device() &&
      sin.device() == x.device() && cos.is_contiguous() && sin.is_contiguous() &&
      cos.sizes() == torch::IntArrayRef({x.size(1), x.size(3) / 2}) && sin.sizes() == cos.sizes() &&
      !cos.requires_grad() && !sin.requires_grad()) {
    const torch::Tensor input = x.contiguous();
    // The kernel loads a pair at a time.
    if (reinterpret_cast<std::uintptr_t>(input.data_ptr()) % (2 * input.element_size()) == 0) {
      return FusedRotation::apply(input, cos, sin);
    }
  }
#endif
  return rotate_pairs_aten(x, cos, sin);
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> split_rotate_qkv(
    const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin, std::int64_t heads,
    std::int64_t kv_heads, [[maybe_unused]] bool fused, [[maybe_unused]] ddp::Float8LinearImpl* producer) {
  TORCH_CHECK(qkv.dim() == 3 && heads > 0 && kv_heads > 0 && qkv.size(2) % (heads + 2 * kv_heads) == 0,
              "llama::ops::split_rotate_qkv: qkv [batch, seq, (heads + 2 kv_heads) * head_dim] expected, got ",
              qkv.sizes(), " for ", heads, " heads and ", kv_heads, " key/value heads");
  const std::int64_t head_dim = qkv.size(2) / (heads + 2 * kv_heads);
#if LLAMA_WITH_CUDA_KERNELS
  if (fused && qkv.is_cuda() && kernel_dtype(qkv) && head_dim > 0 && head_dim % 2 == 0 &&
      cos.scalar_type() == torch::kFloat && sin.scalar_type() == torch::kFloat && cos.device() == qkv.device() &&
      sin.device() == qkv.device() && cos.is_contiguous() && sin.is_contiguous() &&
      cos.sizes() == torch::IntArrayRef({qkv.size(1), head_dim / 2}) && sin.sizes() == cos.sizes() &&
      !cos.requires_grad() && !sin.requires_grad()) {
    const torch::Tensor input = qkv.contiguous();
    // The kernel loads a pair at a time.
    if (reinterpret_cast<std::uintptr_t>(input.data_ptr()) % (2 * input.element_size()) == 0) {
      const auto parts = FusedSplitRotateQkv::apply(input, cos, sin, heads, kv_heads, producer);
      return {parts[0], parts[1], parts[2]};
    }
  }
#endif
  const auto part = [&](std::int64_t first_head, std::int64_t count) {
    return qkv.narrow(2, first_head * head_dim, count * head_dim).view({qkv.size(0), qkv.size(1), count, head_dim});
  };
  return {rotate_pairs(part(0, heads), cos, sin, fused), rotate_pairs(part(heads, kv_heads), cos, sin, fused),
          part(heads + kv_heads, kv_heads)};
}

torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up, [[maybe_unused]] bool fused) {
#if LLAMA_WITH_CUDA_KERNELS
  if (fused && fits_swiglu_kernel(gate, up)) return FusedSwiglu::apply(gate, up);
#endif
  return torch::silu(gate) * up;
}

torch::Tensor swiglu_down(const torch::Tensor& gate, const torch::Tensor& up, ddp::Float8LinearImpl& down,
                          ddp::Float8LinearImpl& gate_layer, ddp::Float8LinearImpl& up_layer, bool fused) {
  if (!fused) return down.forward(swiglu(gate, up, /*fused=*/false));
  return ddp::float8::swiglu_linear(gate, up, down, gate_layer, up_layer,
                                    [](const torch::Tensor& g, const torch::Tensor& u) { return swiglu(g, u, true); });
}

}  // namespace llama::ops
