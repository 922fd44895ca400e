#pragma once

// What the GPU tests that run an op fused and unfused (ATen's ops) share:
// the comparison of outputs and every input's gradient, for one random
// output gradient, and the check that a fused backward refuses create_graph.

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/relative_error.h"

namespace ddp::testing {

/// The tolerance of one rounding to `dtype` (both paths compute in fp32 and
/// round once; sums differ in order).
inline double fused_tolerance(torch::ScalarType dtype) { return dtype == torch::kFloat ? 2e-6 : 8e-3; }

/// Runs `op(leaves, fused)` fused and unfused on leaf copies of `inputs` and
/// compares the outputs and every input's gradient for a random output gradient.
template <typename Op>
void expect_fused_matches_aten(const std::vector<torch::Tensor>& inputs, Op op, torch::ScalarType dtype,
                               const std::string& what) {
  std::vector<torch::Tensor> outputs, grads[2];
  for (const bool fused : {false, true}) {
    std::vector<torch::Tensor> leaves;
    for (const auto& input : inputs) leaves.push_back(input.detach().clone().requires_grad_());
    const torch::Tensor output = op(leaves, fused);
    torch::manual_seed(7);
    const torch::Tensor grad_output = torch::randn(output.sizes(), output.options());
    output.backward(grad_output);
    outputs.push_back(output.detach());
    for (const auto& leaf : leaves) grads[fused].push_back(leaf.grad());
  }
  ASSERT_EQ(outputs[1].sizes(), outputs[0].sizes()) << what;
  const double error = relative_error(outputs[1], outputs[0]);
  std::printf("%s: output relative error %.3g\n", what.c_str(), error);
  EXPECT_LT(error, fused_tolerance(dtype)) << what;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_TRUE(grads[1][i].defined()) << what << ": no gradient for input " << i;
    EXPECT_EQ(grads[1][i].scalar_type(), grads[0][i].scalar_type()) << what << ", input " << i;
    const double grad_error = relative_error(grads[1][i], grads[0][i]);
    std::printf("%s: gradient %zu relative error %.3g\n", what.c_str(), i, grad_error);
    // A weight gradient sums over thousands of rows of rounded products.
    EXPECT_LT(grad_error, 2 * fused_tolerance(dtype)) << what << ", gradient of input " << i;
  }
}

/// Expects the gradient of output.sum() with respect to `input` under
/// create_graph to throw the fused ops' "cannot be differentiated again"
/// (their backward kernels are not recorded by autograd).
inline void expect_not_differentiable_twice(const torch::Tensor& output, const torch::Tensor& input,
                                            const std::string& what) {
  std::string message;
  try {
    torch::autograd::grad({output.sum()}, {input}, {}, /*retain_graph=*/true, /*create_graph=*/true);
  } catch (const std::exception& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("cannot be differentiated again"), std::string::npos)
      << what << " under create_graph: " << (message.empty() ? "no error" : message);
}

}  // namespace ddp::testing
