// Precision on one GPU: the TF32 switch, Float8Linear's accuracy against
// fp64, and a small model trained in fp8 against the same run in bf16.

#include <cstdio>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "support/relative_error.h"
#include "support/float8_gpu.h"

namespace {

using ddp::testing::relative_error;

const torch::Device kGpu(torch::kCUDA, 0);

TEST(Tf32, ChangesALargeMatmulByTheExpectedError) {
  torch::manual_seed(0);
  const auto a = torch::randn({4096, 4096}, torch::TensorOptions().device(kGpu));
  const auto b = torch::randn({4096, 4096}, torch::TensorOptions().device(kGpu));
  const auto reference = torch::matmul(a.to(torch::kDouble), b.to(torch::kDouble));
  double error[2];
  for (const bool tf32 : {false, true}) {
    ddp::PrecisionGuard guard(ddp::PrecisionPolicy::parse(tf32 ? "tf32" : "fp32"), kGpu);
    error[tf32] = relative_error(torch::matmul(a, b), reference);
  }
  std::printf("relative error against fp64: fp32 %.3g, tf32 %.3g\n", error[0], error[1]);
  EXPECT_LT(error[0], 1e-5);
  EXPECT_GT(error[1], 1e-4);
  EXPECT_LT(error[1], 5e-3);
}

/// Float8Linear's documented accuracy (docs/precision.md): relative error
/// against fp64 below 5e-2 for the output and 1e-1 for the gradients, E5M2
/// having one mantissa bit less than E4M3.
TEST(Float8Linear, ForwardAndBackwardStayNearFp64) {
  DDP_SKIP_WITHOUT_FLOAT8();
  for (const auto scaling : {ddp::Float8Scaling::kCurrent, ddp::Float8Scaling::kDelayed}) {
    torch::manual_seed(1);
    ddp::Float8Linear layer(torch::nn::LinearOptions(1024, 2048), ddp::Float8Options().scaling(scaling));
    layer->to(kGpu);
    const auto input = torch::randn({512, 1024}, torch::TensorOptions().device(kGpu)).requires_grad_();
    const auto grad_output = torch::randn({512, 2048}, torch::TensorOptions().device(kGpu));
    // Delayed scaling needs history: two passes before the one that is measured.
    for (int pass = 0; pass < 3; ++pass) {
      input.mutable_grad() = torch::Tensor();
      layer->zero_grad();
      auto output = layer(input);
      ASSERT_EQ(output.scalar_type(), torch::kBFloat16);
      output.backward(grad_output.to(torch::kBFloat16));
      if (pass < 2) continue;

      const auto x = input.detach().to(torch::kDouble).requires_grad_();
      const auto w = layer->weight.detach().to(torch::kDouble).requires_grad_();
      const auto bias = layer->bias.detach().to(torch::kDouble).requires_grad_();
      const auto reference = torch::nn::functional::linear(x, w, bias);
      reference.backward(grad_output.to(torch::kBFloat16).to(torch::kDouble));
      const double forward = relative_error(output.detach(), reference.detach());
      const double grad_input = relative_error(input.grad(), x.grad());
      const double grad_weight = relative_error(layer->weight.grad(), w.grad());
      const double grad_bias = relative_error(layer->bias.grad(), bias.grad());
      std::printf("%s scaling: relative error forward %.3g, grad input %.3g, grad weight %.3g, grad bias %.3g\n",
                  scaling == ddp::Float8Scaling::kCurrent ? "current" : "delayed", forward, grad_input, grad_weight,
                  grad_bias);
      EXPECT_LT(forward, 5e-2);
      EXPECT_LT(grad_input, 1e-1);
      EXPECT_LT(grad_weight, 1e-1);
      EXPECT_LT(grad_bias, 1e-2);
      EXPECT_EQ(layer->weight.grad().scalar_type(), torch::kFloat);
    }
  }
}

/// Float8Options::fp32_weight_gradients: with FP8 off under bf16 autocast,
/// the output and input gradient are torch::nn::Linear's, and the weight and
/// bias gradients are the fp32 GEMM's and sum's, not those rounded to bf16:
/// against fp64 products of the same bf16 operands their error is that of
/// fp32 accumulation, two orders below one bf16 rounding (~2e-3). Off, the
/// layer's weight gradient is Linear's, rounding included.
TEST(Float8Linear, WeightGradientsLeaveTheGemmInFp32UnderAutocast) {
  for (const bool with_bias : {false, true}) {
    for (const bool fp32_grads : {true, false}) {
      torch::manual_seed(4);
      ddp::Float8Linear layer(torch::nn::LinearOptions(1024, 768).bias(with_bias),
                              ddp::Float8Options().enabled(false).fp32_weight_gradients(fp32_grads));
      torch::nn::Linear plain(torch::nn::LinearOptions(1024, 768).bias(with_bias));
      layer->to(kGpu);
      plain->to(kGpu);
      {
        torch::NoGradGuard no_grad;
        plain->weight.copy_(layer->weight);
        if (with_bias) plain->bias.copy_(layer->bias);
      }
      const auto input = torch::randn({4, 256, 1024}, torch::TensorOptions().device(kGpu));
      const auto grad_output = torch::randn({4, 256, 768}, torch::TensorOptions().device(kGpu)).to(torch::kBFloat16);
      torch::Tensor outputs[2], input_grads[2];
      for (int which = 0; which < 2; ++which) {
        const auto x = input.clone().requires_grad_();
        {
          ddp::PrecisionGuard guard(ddp::PrecisionPolicy::parse("bf16"), kGpu);
          outputs[which] = which == 0 ? layer(x) : plain(x);
        }
        outputs[which].backward(grad_output);
        input_grads[which] = x.grad();
      }
      const std::string what =
          std::string(with_bias ? "with" : "without") + " bias, fp32_weight_gradients " + (fp32_grads ? "on" : "off");
      ASSERT_EQ(outputs[0].scalar_type(), torch::kBFloat16) << what;
      // With a bias, the two add it in different order: one bf16 rounding apart.
      EXPECT_LT(relative_error(outputs[0], outputs[1]), with_bias ? 8e-3 : 1e-6) << what;
      EXPECT_EQ(input_grads[0].scalar_type(), torch::kFloat) << what;
      EXPECT_LT(relative_error(input_grads[0], input_grads[1]), 1e-3) << what;

      // fp64 products of the bf16 operands autocast multiplies.
      const auto rows = input.reshape({-1, 1024}).to(torch::kBFloat16).to(torch::kDouble);
      const auto grad_rows = grad_output.reshape({-1, 768}).to(torch::kDouble);
      const double weight_error = relative_error(layer->weight.grad(), grad_rows.t().mm(rows));
      const double plain_error = relative_error(plain->weight.grad(), grad_rows.t().mm(rows));
      std::printf("%s: weight gradient error against fp64 %.3g (torch::nn::Linear's %.3g)\n", what.c_str(),
                  weight_error, plain_error);
      ASSERT_EQ(layer->weight.grad().scalar_type(), torch::kFloat) << what;
      EXPECT_GT(plain_error, 1e-3) << what;
      if (fp32_grads) {
        EXPECT_LT(weight_error, 1e-5) << what;
      } else {
        EXPECT_EQ(relative_error(layer->weight.grad(), plain->weight.grad()), 0) << what;
      }
      if (with_bias) {
        const double bias_error = relative_error(layer->bias.grad(), grad_rows.sum(0));
        EXPECT_LT(bias_error, fp32_grads ? 1e-5 : 1e-2) << what;
      }
    }
  }
}

/// A student MLP learns a fixed random teacher's classes.
struct Student : torch::nn::Module {
  explicit Student(bool float8) {
    const auto options = ddp::Float8Options().enabled(false);
    for (auto [in, out] : {std::pair{256, 1024}, std::pair{1024, 1024}, std::pair{1024, 64}}) {
      layers.push_back(register_module("layer" + std::to_string(layers.size()),
                                       ddp::Float8Linear(torch::nn::LinearOptions(in, out), options)));
    }
    if (float8) ddp::float8::enable_float8(*this);
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i + 1 < layers.size(); ++i) x = torch::gelu(layers[i](x));
    return layers.back()(x);
  }
  std::vector<ddp::Float8Linear> layers;
};

double train_and_evaluate(const std::string& precision) {
  const auto policy = ddp::PrecisionPolicy::parse(precision);
  torch::manual_seed(2);
  const auto teacher = torch::randn({256, 64}, torch::TensorOptions().device(kGpu));
  const auto eval_x = torch::randn({4096, 256}, torch::TensorOptions().device(kGpu));
  const auto eval_y = eval_x.matmul(teacher).argmax(1);
  torch::manual_seed(3);
  auto student = std::make_shared<Student>(policy.uses_float8());
  student->to(kGpu);
  torch::optim::AdamW optimizer(student->parameters(), torch::optim::AdamWOptions(1e-3));
  for (int step = 0; step < 300; ++step) {
    const auto x = torch::randn({1024, 256}, torch::TensorOptions().device(kGpu));
    torch::Tensor loss;
    {
      ddp::PrecisionGuard guard(policy, kGpu);
      loss = torch::nn::functional::cross_entropy(student->forward(x), x.matmul(teacher).argmax(1));
    }
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
  }
  torch::NoGradGuard no_grad;
  ddp::PrecisionGuard guard(policy, kGpu);
  return torch::nn::functional::cross_entropy(student->forward(eval_x), eval_y).item<double>();
}

TEST(Float8Training, SmallModelReachesTheBf16Loss) {
  DDP_SKIP_WITHOUT_FLOAT8();
  const double bf16 = train_and_evaluate("bf16");
  const double fp8 = train_and_evaluate("fp8");
  std::printf("held-out loss after 300 steps: bf16 %.4f, fp8 %.4f (%+.2f%%); untrained %.4f\n", bf16, fp8,
              100 * (fp8 - bf16) / bf16, std::log(64.0));
  EXPECT_LT(bf16, 0.5 * std::log(64.0)) << "the bf16 run did not learn";
  EXPECT_LT(std::abs(fp8 - bf16) / bf16, 0.02);
}

}  // namespace
