// ddp::rms_norm and ddp::add_rms_norm on the CPU, where both settings of
// RMSNormOptions::fused run ATen's ops: the values against a hand
// computation, and the residual add's two outputs.

#include <cmath>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

namespace {

TEST(RmsNorm, MatchesAHandComputation) {
  // One row of 4: mean(x^2) = (1 + 4 + 9 + 16) / 4 = 7.5.
  const auto x = torch::tensor({{1.0f, -2.0f, 3.0f, 4.0f}, {0.0f, 0.0f, 0.0f, 2.0f}});
  const auto weight = torch::tensor({1.0f, 0.5f, 2.0f, -1.0f});
  const double eps = 1e-5;
  const auto y = ddp::rms_norm(x, weight, ddp::RMSNormOptions().eps(eps).fused(false));
  const float r0 = 1.0f / std::sqrt(7.5f + 1e-5f), r1 = 1.0f / std::sqrt(1.0f + 1e-5f);
  const auto expected = torch::tensor({{r0, -r0, 6 * r0, -4 * r0}, {0.0f, 0.0f, 0.0f, -2 * r1}});
  EXPECT_TRUE(torch::allclose(y, expected, 1e-6, 1e-6)) << y << expected;
  // Computed in fp32, returned in x's dtype.
  EXPECT_EQ(ddp::rms_norm(x.to(torch::kBFloat16), weight).scalar_type(), torch::kBFloat16);
}

TEST(RmsNorm, FusedOnTheCpuIsTheAtenPath) {
  torch::manual_seed(3);
  const auto x = torch::randn({3, 5, 8}).requires_grad_();
  const auto weight = (torch::rand({8}) + 0.5).requires_grad_();
  const auto fused = ddp::rms_norm(x, weight, ddp::RMSNormOptions().fused(true));
  const auto aten = ddp::rms_norm(x, weight, ddp::RMSNormOptions().fused(false));
  EXPECT_TRUE(torch::equal(fused, aten));
  const auto grads = torch::autograd::grad({fused.sum()}, {x, weight});
  const auto aten_grads = torch::autograd::grad({aten.sum()}, {x, weight});
  EXPECT_TRUE(torch::equal(grads[0], aten_grads[0]));
  EXPECT_TRUE(torch::equal(grads[1], aten_grads[1]));
}

TEST(RmsNorm, AddRmsNormReturnsTheSumAndItsNorm) {
  torch::manual_seed(4);
  const auto x = torch::randn({2, 6, 8});
  const auto delta = torch::randn({2, 6, 8});
  const auto weight = torch::rand({8}) + 0.5;
  for (const bool fused : {false, true}) {
    const auto options = ddp::RMSNormOptions().eps(1e-6).fused(fused);
    const auto [h, normed] = ddp::add_rms_norm(x, delta, weight, options);
    EXPECT_TRUE(torch::equal(h, x + delta)) << "fused " << fused;
    EXPECT_TRUE(torch::equal(normed, ddp::rms_norm(x + delta, weight, options))) << "fused " << fused;
  }
}

}  // namespace
