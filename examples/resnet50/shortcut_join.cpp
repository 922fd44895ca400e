#include "shortcut_join.h"

#include <tuple>

#include <torch/autograd.h>

namespace resnet {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// [N, C, H, W] channels_last-contiguous as the [N * H * W, C] matrix its
/// memory is: a view, which in-place writes go through.
torch::Tensor rows(const torch::Tensor& t) { return t.permute({0, 2, 3, 1}).view({-1, t.size(1)}); }

struct Conv1x1AndShortcut : torch::autograd::Function<Conv1x1AndShortcut> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight) {
    torch::Tensor input = x, weight_cast = weight.to(x.scalar_type());
    const torch::Tensor y = torch::conv2d(input, weight_cast);
    // Under autocast to another dtype than x's the convolution ran in that
    // one: so does the backward.
    if (y.scalar_type() != x.scalar_type()) {
      input = x.to(y.scalar_type());
      weight_cast = weight.to(y.scalar_type());
    }
    ctx->save_for_backward({input, weight_cast});
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    // Returning an input, autograd hands out a view of it with this node as
    // its history: the shortcut's gradient arrives here apart from y's.
    return {y, x};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(!torch::GradMode::is_enabled(),
                "resnet::conv1x1_and_shortcut: the joined backward cannot be differentiated again (create_graph)");
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& weight_cast = saved[1];
    const torch::Tensor& grad_y = grads[0];
    torch::Tensor grad_x = grads[1], grad_weight;
    if (grad_y.defined()) {
      const torch::Tensor grad_y_rows = rows(grad_y.contiguous(torch::MemoryFormat::ChannelsLast));
      const torch::Tensor weight_matrix = weight_cast.reshape({weight_cast.size(0), weight_cast.size(1)});
      if (ctx->needs_input_grad(1)) {
        // cuDNN's weight gradient, as the convolution's own backward computes it.
        grad_weight = std::get<1>(torch::convolution_backward(grad_y, x, weight_cast, {}, {1, 1}, {0, 0}, {1, 1}, false,
                                                              {0, 0}, 1, {false, true, false}))
                          .to(static_cast<c10::ScalarType>(ctx->saved_data["weight_dtype"].toInt()));
      }
      if (ctx->needs_input_grad(0)) {
        if (grad_x.defined()) {
          grad_x = grad_x.to(grad_y.scalar_type()).contiguous(torch::MemoryFormat::ChannelsLast);
          rows(grad_x).addmm_(grad_y_rows, weight_matrix);
        } else {
          grad_x =
              grad_y_rows.mm(weight_matrix).view({x.size(0), x.size(2), x.size(3), x.size(1)}).permute({0, 3, 1, 2});
        }
      }
    }
    return {grad_x, grad_weight};
  }
};

}  // namespace

bool shortcut_join_applies(const torch::Tensor& x, const torch::Tensor& weight) {
  return x.dim() == 4 && x.is_contiguous(torch::MemoryFormat::ChannelsLast) && weight.dim() == 4 &&
         weight.size(2) == 1 && weight.size(3) == 1 && weight.size(1) == x.size(1) && weight.is_floating_point() &&
         x.is_floating_point();
}

std::pair<torch::Tensor, torch::Tensor> conv1x1_and_shortcut(const torch::Tensor& x, const torch::Tensor& weight) {
  if (!shortcut_join_applies(x, weight)) return {torch::conv2d(x, weight), x};
  const variable_list outputs = Conv1x1AndShortcut::apply(x, weight);
  return {outputs[0], outputs[1]};
}

}  // namespace resnet
