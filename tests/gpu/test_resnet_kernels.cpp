// ResNet-50's max-pooling kernels (examples/resnet50/max_pool_kernels.cu)
// against ATen's max_pool2d: the same values and the same gradients, bit for
// bit (the same elements win, ties and NaN included, and gradients are summed
// in ATen's order), in each dtype, vectorized and not. And the blocks' joined
// shortcut gradient (shortcut_join.h) against autograd's sum.

#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/precision.h>

#include "max_pool.h"
#include "resnet.h"
#include "shortcut_join.h"

namespace {

const torch::Device kGpu(torch::kCUDA, 0);

struct Case {
  int64_t batch, channels, height, width, kernel, stride, padding;
};

std::string describe(const Case& c, torch::ScalarType dtype) {
  return std::string(c10::toString(dtype)) + " [" + std::to_string(c.batch) + ", " + std::to_string(c.channels) + ", " +
         std::to_string(c.height) + ", " + std::to_string(c.width) + "] kernel " + std::to_string(c.kernel) +
         " stride " + std::to_string(c.stride) + " padding " + std::to_string(c.padding);
}

/// Values after a ReLU, rounded to eighths: many ties (zeros above all),
/// which decide where the gradient goes.
torch::Tensor tied_input(const Case& c, torch::ScalarType dtype) {
  const torch::Tensor x = torch::randn({c.batch, c.channels, c.height, c.width}, torch::TensorOptions(kGpu));
  return (torch::relu(x) * 8).round().div(8).to(dtype).contiguous(torch::MemoryFormat::ChannelsLast);
}

void expect_same_as_aten(const torch::Tensor& input, const Case& c, const std::string& what) {
  ASSERT_TRUE(resnet::max_pool2d_fused(input, c.kernel, c.stride, c.padding)) << what << ": the kernels must take it";
  torch::Tensor outputs[2], grads[2];
  const torch::Tensor grad_output = [&] {
    const torch::Tensor y = torch::max_pool2d(input, c.kernel, c.stride, c.padding);
    return torch::randn(y.sizes(), y.options()).contiguous(torch::MemoryFormat::ChannelsLast);
  }();
  for (const bool fused : {false, true}) {
    const torch::Tensor x = input.detach().clone().requires_grad_();
    const torch::Tensor y = fused ? resnet::max_pool2d(x, c.kernel, c.stride, c.padding)
                                  : torch::max_pool2d(x, c.kernel, c.stride, c.padding);
    y.backward(grad_output);
    outputs[fused] = y.detach();
    grads[fused] = x.grad();
  }
  EXPECT_TRUE(outputs[1].is_contiguous(torch::MemoryFormat::ChannelsLast)) << what;
  EXPECT_TRUE(grads[1].is_contiguous(torch::MemoryFormat::ChannelsLast)) << what;
  ASSERT_EQ(outputs[1].sizes(), outputs[0].sizes()) << what;
  // equal_nan: a NaN window's output is NaN on both sides.
  EXPECT_TRUE(torch::allclose(outputs[1], outputs[0], 0, 0, /*equal_nan=*/true)) << what << ": outputs differ";
  EXPECT_TRUE(torch::equal(grads[1], grads[0]))
      << what << ": gradients differ, largest by "
      << (grads[1].to(torch::kFloat) - grads[0].to(torch::kFloat)).abs().max().item<float>();
}

TEST(ResNetKernels, MaxPoolMatchesAten) {
  torch::manual_seed(0);
  const Case cases[] = {
      {4, 64, 112, 112, 3, 2, 1},  // ResNet-50's stem, vectorized
      {2, 24, 15, 17, 3, 2, 1},    // odd sizes: vectorized in fp32 and fp16/bf16 (24 = 3 packs of 8)
      {2, 5, 9, 11, 3, 2, 1},      // 5 channels: one per thread
      {2, 16, 12, 12, 2, 2, 0},    // windows that do not overlap: each input in one window at most
      {2, 16, 10, 10, 3, 1, 1},    // stride 1: up to nine windows share an input
      {1, 8, 20, 20, 5, 3, 2},
  };
  for (const auto dtype : {torch::kBFloat16, torch::kFloat, torch::kHalf}) {
    for (const Case& c : cases) expect_same_as_aten(tied_input(c, dtype), c, describe(c, dtype));
  }
}

TEST(ResNetKernels, MaxPoolPropagatesNanAsAten) {
  torch::manual_seed(1);
  const Case c{2, 16, 9, 9, 3, 2, 1};
  for (const auto dtype : {torch::kBFloat16, torch::kFloat}) {
    torch::Tensor x = tied_input(c, dtype);
    x.index_put_({0, 3, 4, 4}, std::nan(""));
    x.index_put_({1, 7, 0, 0}, std::nan(""));
    expect_same_as_aten(x, c, "NaN, " + describe(c, dtype));
  }
}

TEST(ResNetKernels, MaxPoolLeavesOtherInputsToAten) {
  const torch::Tensor nchw = torch::randn({2, 8, 9, 9}, torch::TensorOptions(kGpu));
  EXPECT_FALSE(resnet::max_pool2d_fused(nchw, 3, 2, 1)) << "a contiguous (NCHW) input goes to ATen";
  EXPECT_FALSE(resnet::max_pool2d_fused(nchw.cpu().contiguous(torch::MemoryFormat::ChannelsLast), 3, 2, 1));
  EXPECT_FALSE(resnet::max_pool2d_fused(nchw.contiguous(torch::MemoryFormat::ChannelsLast), 17, 1, 8))
      << "17 x 17 windows do not fit a byte's offsets";
  EXPECT_TRUE(torch::equal(resnet::max_pool2d(nchw, 3, 2, 1), torch::max_pool2d(nchw, 3, 2, 1)));
}

/// The input's and every parameter's gradient of a loss over `block`'s output.
std::vector<torch::Tensor> block_gradients(resnet::Bottleneck& block, const torch::Tensor& input,
                                           const ddp::PrecisionPolicy& policy) {
  block->zero_grad();
  const torch::Tensor x = input.detach().clone().requires_grad_();
  {
    ddp::PrecisionGuard guard(policy, kGpu);
    const torch::Tensor y = block->forward(x).to(torch::kFloat);
    (y * torch::linspace(-1, 1, y.numel(), y.options()).view_as(y)).sum().backward();
  }
  std::vector<torch::Tensor> grads{x.grad().to(torch::kFloat)};
  for (const auto& p : block->parameters()) grads.push_back(p.grad().clone());
  return grads;
}

// On the GPU conv1's input gradient is a cuBLAS GEMM that adds the
// shortcut's gradient, and the BatchNorm is cuDNN's fused one: against
// autograd's add, equal within fp32's rounding (TF32 off), and within
// bf16's (which the joined sum rounds once, the add twice).
TEST(ResNetKernels, JoinedShortcutGradientMatchesAutogradsSum) {
  for (const auto precision : {ddp::Precision::kFp32, ddp::Precision::kBf16}) {
    for (const bool downsample : {false, true}) {
      torch::manual_seed(2);
      resnet::Bottleneck block(downsample ? 128 : 256, 64, downsample ? 2 : 1);
      block->to(kGpu);
      for (auto& p : block->parameters()) {
        if (p.dim() == 4) p.set_data(p.data().contiguous(torch::MemoryFormat::ChannelsLast));
      }
      const torch::Tensor input = torch::randn({8, downsample ? 128 : 256, 28, 28}, torch::TensorOptions(kGpu))
                                      .to(precision == ddp::Precision::kBf16 ? torch::kBFloat16 : torch::kFloat)
                                      .contiguous(torch::MemoryFormat::ChannelsLast);
      ASSERT_TRUE(resnet::shortcut_join_applies(input, block->conv1->weight));
      block->join_shortcut_gradient = false;
      const auto expected = block_gradients(block, input, precision);
      block->join_shortcut_gradient = true;
      const auto joined = block_gradients(block, input, precision);
      const double tolerance = precision == ddp::Precision::kBf16 ? 2e-2 : 1e-4;
      for (std::size_t i = 0; i < expected.size(); ++i) {
        const double scale = expected[i].abs().max().item<double>();
        EXPECT_TRUE(torch::allclose(joined[i], expected[i], tolerance, tolerance * scale))
            << (precision == ddp::Precision::kBf16 ? "bf16" : "fp32") << (downsample ? ", downsampling" : "")
            << ", gradient " << i << " (0: the input) differs by "
            << (joined[i] - expected[i]).abs().max().item<double>() << " of " << scale;
      }
    }
  }
}

}  // namespace
