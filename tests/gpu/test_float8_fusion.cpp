// FP8 casts written by another kernel (float8/linear_state.h): a
// Float8Linear handed the placeholder of an offered cast computes what it
// computes from the tensor itself, forward and backward, and anything else
// handed to it in the placeholder's place is an error. The "other kernel"
// here is the plain cast kernel writing into the offered destination, so
// both ways must agree bit for bit.

#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "float8/linear_state.h"

namespace {

const torch::Device kGpu(torch::kCUDA, 0);
using Access = ddp::detail::Float8LinearAccess;

ddp::Float8Options delayed() { return ddp::Float8Options().scaling(ddp::Float8Scaling::kDelayed).amax_history_len(4); }

/// Casts `tensor` as a fused kernel would, and returns the placeholder.
torch::Tensor offer_cast_of(const torch::Tensor& tensor, ddp::detail::TensorScaling& scaling) {
  const auto rows = tensor.reshape({-1, tensor.size(-1)}).contiguous();
  ddp::Float8Tensor destination = scaling.destination(rows.size(0), rows.size(1));
  ddp::float8::cast_transpose(rows, destination);
  return scaling.offer(destination, tensor.sizes(), tensor.scalar_type());
}

/// Passes its input through; in backward, offers the cast of the gradient
/// to `scaling` (the layer before it) and returns the placeholder.
struct OfferGradientCast : torch::autograd::Function<OfferGradientCast> {
  static torch::Tensor forward(torch::autograd::AutogradContext* context, const torch::Tensor& x,
                               ddp::detail::TensorScaling* scaling) {
    scaling->save_to(context, "scaling.");
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 torch::autograd::variable_list grads) {
    auto scaling = ddp::detail::TensorScaling::load_from(context, "scaling.");
    return {offer_cast_of(grads[0], scaling), torch::Tensor()};
  }
};

TEST(Float8Fusion, OfferedCastsGiveWhatTheLayerComputesItself) {
  torch::manual_seed(11);
  const auto bf16 = torch::TensorOptions().device(kGpu).dtype(torch::kBFloat16);
  ddp::Float8Linear own(torch::nn::LinearOptions(256, 128).bias(false), delayed());
  ddp::Float8Linear fused(torch::nn::LinearOptions(256, 128).bias(false), delayed());
  own->to(kGpu);
  fused->to(kGpu);
  {
    torch::NoGradGuard no_grad;
    fused->weight.copy_(own->weight);
  }
  for (int step = 0; step < 3; ++step) {
    const std::string at = "step " + std::to_string(step);
    const auto input = (torch::randn({2, 32, 256}, bf16) * (step + 1)).requires_grad_();
    const auto grad_output = torch::randn({2, 32, 128}, bf16) * 1e-3;

    const auto expected = own(input);
    expected.backward(grad_output);

    ddp::detail::TensorScaling* input_scaling = Access::fusable_input_scaling(*fused, kGpu);
    ASSERT_NE(input_scaling, nullptr);
    const auto placeholder = offer_cast_of(input.detach(), *input_scaling);
    EXPECT_EQ(placeholder.sizes(), input.sizes());
    EXPECT_EQ(placeholder.stride(0), 0) << "the placeholder holds no values";
    // The input's gradient goes to a leaf standing in for the placeholder.
    const auto placeholder_leaf = placeholder.detach().requires_grad_();
    auto output = fused(placeholder_leaf);
    ddp::detail::TensorScaling* grad_scaling = Access::fusable_grad_output_scaling(*fused);
    ASSERT_NE(grad_scaling, nullptr);
    output = OfferGradientCast::apply(output, grad_scaling);
    output.backward(grad_output);

    EXPECT_TRUE(torch::equal(output.detach(), expected.detach())) << at << ": output";
    EXPECT_TRUE(torch::equal(placeholder_leaf.grad(), input.grad())) << at << ": input gradient";
    EXPECT_TRUE(torch::equal(fused->weight.grad(), own->weight.grad())) << at << ": weight gradient";
    const auto own_amaxes = own->latest_amaxes();
    const auto fused_amaxes = fused->latest_amaxes();
    ASSERT_EQ(fused_amaxes.size(), 3u);
    for (std::size_t i = 0; i < own_amaxes.size(); ++i) {
      EXPECT_TRUE(torch::equal(fused_amaxes[i], own_amaxes[i])) << at << ": amax " << i;
    }
  }
}

TEST(Float8Fusion, ALayerGivenAnotherTensorThanTheOfferedOneRefuses) {
  torch::manual_seed(12);
  const auto bf16 = torch::TensorOptions().device(kGpu).dtype(torch::kBFloat16);
  ddp::Float8Linear layer(torch::nn::LinearOptions(64, 32).bias(false), delayed());
  layer->to(kGpu);
  const auto input = torch::randn({16, 64}, bf16);
  ddp::detail::TensorScaling* scaling = Access::fusable_input_scaling(*layer, kGpu);
  ASSERT_NE(scaling, nullptr);
  const auto placeholder = offer_cast_of(input, *scaling);
  EXPECT_EQ(placeholder.sizes(), input.sizes());
  std::string message;
  try {
    layer(input.clone());
  } catch (const ddp::UsageError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("a fused kernel wrote the FP8 cast of this layer's input"), std::string::npos)
      << (message.empty() ? "no error" : message);
  // The offer is gone: the layer casts what it is given again.
  EXPECT_NO_THROW(layer(input));
}

TEST(Float8Fusion, OnlyDelayedScalingIsFusable) {
  ddp::Float8Linear current(torch::nn::LinearOptions(64, 32), ddp::Float8Options());
  ddp::Float8Linear off(torch::nn::LinearOptions(64, 32), delayed().enabled(false));
  current->to(kGpu);
  off->to(kGpu);
  EXPECT_EQ(Access::fusable_input_scaling(*current, kGpu), nullptr) << "current scaling";
  EXPECT_EQ(Access::fusable_input_scaling(*off, kGpu), nullptr) << "FP8 off";
  ddp::Float8Linear fresh(torch::nn::LinearOptions(64, 32), delayed());
  fresh->to(kGpu);
  EXPECT_EQ(Access::fusable_grad_output_scaling(*fresh), nullptr) << "before the first forward";
  EXPECT_NE(Access::fusable_input_scaling(*fresh, kGpu), nullptr) << "makes the state";
}

}  // namespace
