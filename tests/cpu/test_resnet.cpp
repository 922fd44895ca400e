// The bundled ResNet-50 is torchvision's (same parameter count and names), and its
// joined shortcut gradient equals autograd's sum; each BatchNorm layer counts its batches once.

#include <map>
#include <string>

#include <gtest/gtest.h>

#include "resnet.h"
#include "shortcut_join.h"

TEST(ResNet50, HasTorchvisionsParameterCountAndNames) {
  auto model = resnet::resnet50();
  int64_t count = 0;
  for (const auto& p : model->parameters()) count += p.numel();
  EXPECT_EQ(count, 25'557'032);
  const auto names = model->named_parameters();
  EXPECT_TRUE(names.contains("layer1.0.downsample.0.weight"));
  EXPECT_TRUE(names.contains("layer4.2.bn3.bias"));
  EXPECT_TRUE(names.contains("fc.weight"));
  EXPECT_EQ(model->forward(torch::randn({2, 3, 64, 64})).sizes(), (std::vector<int64_t>{2, 1000}));
}

namespace {

/// Forward and backward of `block` from a copy of `input`: the loss's
/// gradients of the input and of every parameter, by name.
std::map<std::string, torch::Tensor> gradients(resnet::Bottleneck& block, const torch::Tensor& input) {
  block->zero_grad();
  const torch::Tensor x = input.detach().clone().requires_grad_();
  // A loss with a different weight on each output element.
  const torch::Tensor y = block->forward(x);
  (y * torch::linspace(-1, 1, y.numel()).view_as(y)).sum().backward();
  std::map<std::string, torch::Tensor> grads{{"input", x.grad()}};
  for (const auto& p : block->named_parameters()) grads[p.key()] = p.value().grad().clone();
  return grads;
}

}  // namespace

// conv1's input gradient with the shortcut's added in its GEMM equals
// autograd's sum of the two, with and without a downsampling shortcut, and
// leaves the gradients of the layers the shortcut's gradient also feeds alone.
TEST(ResNet50, JoinedShortcutGradientEqualsAutogradsSum) {
  torch::manual_seed(0);
  for (const bool downsample : {false, true}) {
    resnet::Bottleneck block(downsample ? 32 : 64, 16, downsample ? 2 : 1);
    block->train();
    const torch::Tensor input =
        torch::randn({2, downsample ? 32 : 64, 8, 8}).contiguous(torch::MemoryFormat::ChannelsLast);
    ASSERT_TRUE(resnet::shortcut_join_applies(input, block->conv1->weight));
    block->join_shortcut_gradient = false;
    auto expected = gradients(block, input);
    block->join_shortcut_gradient = true;
    auto joined = gradients(block, input);
    ASSERT_EQ(joined.size(), expected.size());
    for (const auto& [name, grad] : expected) {
      EXPECT_TRUE(torch::allclose(joined.at(name), grad, 1e-5, 1e-6))
          << (downsample ? "downsampling block, " : "") << name << " differs by "
          << (joined.at(name) - grad).abs().max().item<float>();
    }
    EXPECT_TRUE(joined.at("input").is_contiguous(torch::MemoryFormat::ChannelsLast));
  }
  // Not channels_last: conv1 and the input itself, unjoined.
  EXPECT_FALSE(resnet::shortcut_join_applies(torch::randn({2, 64, 8, 8}), torch::randn({16, 64, 1, 1})));
}

// Each BatchNorm layer counts a training batch once, as its own forward would:
// the fused layers in ResNetImpl's one add, a layer with a cumulative average
// (no momentum) in its module's forward, a layer in eval mode not at all.
TEST(ResNet50, CountsEachBatchNormsBatchesOnce) {
  resnet::ResNet model(std::vector<int64_t>{1, 1, 1, 1}, 10);
  model->train();
  auto* cumulative = model->bn1.ptr()->as<torch::nn::BatchNorm2d>();
  cumulative->options.momentum({});  // none: a cumulative average
  auto* frozen = model->layer4[0]->as<resnet::Bottleneck>()->bn2.ptr()->as<torch::nn::BatchNorm2d>();
  frozen->eval();
  const torch::Tensor input = torch::randn({2, 3, 32, 32}).contiguous(torch::MemoryFormat::ChannelsLast);
  for (int step = 0; step < 2; ++step) model->forward(input);
  int64_t layers = 0;
  for (const auto& module : model->modules(/*include_self=*/false)) {
    auto* bn = module->as<torch::nn::BatchNorm2d>();
    if (bn == nullptr) continue;
    ++layers;
    EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), bn == frozen ? 0 : 2) << "BatchNorm layer " << layers;
  }
  EXPECT_EQ(layers, 17);
}
