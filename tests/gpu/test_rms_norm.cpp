// ddp::rms_norm and ddp::add_rms_norm on CUDA: libddp's kernels
// (fused(true)) against ATen's ops (fused(false)), values and gradients, in
// every dtype the kernels take, vectorized and not, under autocast, and what
// they owe autograd beyond their values.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "support/fused_comparison.h"
#include "support/relative_error.h"

namespace {

using ddp::testing::expect_fused_matches_aten;
using ddp::testing::expect_not_differentiable_twice;
using ddp::testing::relative_error;

const torch::Device kGpu(torch::kCUDA, 0);

ddp::RMSNormOptions options(bool fused) { return ddp::RMSNormOptions().eps(1e-5).fused(fused); }

TEST(RmsNormGpu, KernelsAreBuilt) { EXPECT_TRUE(ddp::rms_norm_kernels_built()); }

TEST(RmsNormGpu, MatchesAten) {
  // 2048 columns: the vectorized kernel, and more rows than backward's blocks;
  // 102: the scalar kernel.
  for (const std::int64_t cols : {2048, 102}) {
    for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
      torch::manual_seed(1);
      const auto x = torch::randn({4, 2500, cols}, torch::TensorOptions().device(kGpu)).to(dtype);
      const auto weight = 1 + 0.5 * torch::randn({cols}, torch::TensorOptions().device(kGpu));
      expect_fused_matches_aten(
          {x, weight},
          [](const std::vector<torch::Tensor>& in, bool fused) {
            const torch::Tensor y = ddp::rms_norm(in[0], in[1], options(fused));
            // The fused call must have run the kernels, not the ATen ops it is compared with.
            EXPECT_EQ(fused, y.grad_fn()->name().find("FusedRmsNorm") != std::string::npos) << y.grad_fn()->name();
            return y;
          },
          dtype, "rms_norm " + std::string(c10::toString(dtype)) + " cols " + std::to_string(cols));
    }
  }
}

TEST(RmsNormGpu, UnderAutocastReturnsTheAutocastDtype) {
  torch::manual_seed(2);
  const auto x = torch::randn({8, 512, 256}, torch::TensorOptions().device(kGpu)).requires_grad_();
  const auto weight = (1 + 0.5 * torch::randn({256}, torch::TensorOptions().device(kGpu))).requires_grad_();
  torch::Tensor fused, aten;
  {
    ddp::PrecisionGuard guard(ddp::PrecisionPolicy::parse("bf16"), kGpu);
    fused = ddp::rms_norm(x, weight, options(true));
    aten = ddp::rms_norm(x, weight, options(false));
  }
  EXPECT_EQ(fused.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(aten.scalar_type(), torch::kFloat);
  // The same values as the fp32 result rounded to bf16, as autocast would.
  EXPECT_LT(relative_error(fused, aten.to(torch::kBFloat16)), 1e-3);
  const auto grad = torch::randn(x.sizes(), x.options());
  const auto fused_grads = torch::autograd::grad({fused}, {x, weight}, {grad.to(torch::kBFloat16)});
  const auto aten_grads = torch::autograd::grad({aten}, {x, weight}, {grad.to(torch::kBFloat16).to(torch::kFloat)});
  EXPECT_EQ(fused_grads[0].scalar_type(), torch::kFloat);
  EXPECT_LT(relative_error(fused_grads[0], aten_grads[0]), 1e-5);
  EXPECT_LT(relative_error(fused_grads[1], aten_grads[1]), 1e-5);
}

TEST(RmsNormGpu, AddRmsNormMatchesAten) {
  // 2048 columns: the vectorized kernel, two packs of a row per thread; 4096:
  // four; 102: the scalar kernel; 1030: scalar with four per thread and the
  // row's last 6 read again after the block's sum. Both outputs (the sum and
  // its norm) get a gradient, so the backward adds the sum's.
  for (const std::int64_t cols : {2048, 4096, 102, 1030}) {
    for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
      torch::manual_seed(5);
      const auto x = torch::randn({4, 700, cols}, torch::TensorOptions().device(kGpu)).to(dtype);
      const auto delta = torch::randn({4, 700, cols}, torch::TensorOptions().device(kGpu)).to(dtype);
      const auto weight = 1 + 0.5 * torch::randn({cols}, torch::TensorOptions().device(kGpu));
      expect_fused_matches_aten(
          {x, delta, weight},
          [](const std::vector<torch::Tensor>& in, bool fused) {
            const auto [h, normed] = ddp::add_rms_norm(in[0], in[1], in[2], options(fused));
            EXPECT_EQ(fused, normed.grad_fn()->name().find("FusedAddRmsNorm") != std::string::npos)
                << normed.grad_fn()->name();
            return torch::cat({h.flatten(), normed.flatten()});
          },
          dtype, "add_rms_norm " + std::string(c10::toString(dtype)) + " cols " + std::to_string(cols));
    }
  }
}

// As in a decoder: an fp32 residual stream, a bf16 delta from autocast's
// linear layers, the norm returned in bf16 for the next ones.
TEST(RmsNormGpu, AddRmsNormUnderAutocastKeepsTheStreamInFp32) {
  torch::manual_seed(6);
  const auto x = torch::randn({8, 512, 256}, torch::TensorOptions().device(kGpu)).requires_grad_();
  const auto delta =
      torch::randn({8, 512, 256}, torch::TensorOptions().device(kGpu)).to(torch::kBFloat16).requires_grad_();
  const auto weight = (1 + 0.5 * torch::randn({256}, torch::TensorOptions().device(kGpu))).requires_grad_();
  std::pair<torch::Tensor, torch::Tensor> fused, aten;
  {
    ddp::PrecisionGuard guard(ddp::PrecisionPolicy::parse("bf16"), kGpu);
    fused = ddp::add_rms_norm(x, delta, weight, options(true));
    aten = ddp::add_rms_norm(x, delta, weight, options(false));
  }
  EXPECT_EQ(fused.first.scalar_type(), torch::kFloat);
  EXPECT_EQ(fused.second.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(relative_error(fused.first, aten.first), 0);
  EXPECT_LT(relative_error(fused.second, aten.second.to(torch::kBFloat16)), 1e-3);
  const auto grad_h = torch::randn(x.sizes(), x.options());
  const auto grad_y = torch::randn(x.sizes(), x.options()).to(torch::kBFloat16);
  const auto fused_grads = torch::autograd::grad({fused.first, fused.second}, {x, delta, weight}, {grad_h, grad_y});
  const auto aten_grads =
      torch::autograd::grad({aten.first, aten.second}, {x, delta, weight}, {grad_h, grad_y.to(aten.second.dtype())});
  EXPECT_EQ(fused_grads[0].scalar_type(), torch::kFloat);
  EXPECT_EQ(fused_grads[1].scalar_type(), torch::kBFloat16);
  EXPECT_LT(relative_error(fused_grads[0], aten_grads[0]), 1e-5);
  EXPECT_LT(relative_error(fused_grads[1], aten_grads[1]), 1e-2);
  EXPECT_LT(relative_error(fused_grads[2], aten_grads[2]), 1e-5);
}

/// What the fused op owes autograd beyond its values, as the ATen ops give
/// it: an output that may be modified in place, and for gradients of
/// gradients an error instead of silently missing terms.
TEST(RmsNormGpu, BehavesUnderAutogradAsTheAtenOps) {
  const auto cuda = torch::TensorOptions().device(kGpu);
  torch::manual_seed(8);
  const auto x = torch::randn({16, 64}, cuda).requires_grad_();
  const auto weight = (torch::rand({64}, cuda) + 0.5).requires_grad_();
  torch::Tensor grads[2];
  for (const bool fused : {false, true}) {
    auto y = ddp::rms_norm(x, weight, options(fused));
    y.mul_(3);
    grads[fused] = torch::autograd::grad({y.sum()}, {x})[0];
  }
  EXPECT_LT(relative_error(grads[1], grads[0]), 1e-5) << "rms_norm output modified in place";

  const auto delta = torch::randn({16, 64}, cuda).requires_grad_();
  const std::pair<const char*, torch::Tensor> cases[] = {
      {"rms_norm", ddp::rms_norm(x, weight, options(true))},
      {"add_rms_norm", ddp::add_rms_norm(x, delta, weight, options(true)).second}};
  for (const auto& [name, output] : cases) expect_not_differentiable_twice(output, x, name);
}

}  // namespace
