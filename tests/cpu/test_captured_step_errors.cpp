// What ddp::CapturedStep refuses before anything reaches a GPU: on the CPU
// machine of CI, every way to build one is a UsageError that says why.

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

namespace {

at::Tensor no_step(const std::vector<at::Tensor>&) { return {}; }

std::string error_of(torch::optim::Optimizer& optimizer, ddp::CapturedStepOptions options = {}) {
  try {
    ddp::CapturedStep step(optimizer, no_step, options);
  } catch (const ddp::UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(CapturedStepErrors, AnOptimizerWithoutACapturableModeIsRefused) {
  torch::nn::Linear model(4, 4);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_NE(error_of(optimizer).find("use ddp::optim::FusedAdamW or ddp::optim::FusedSGD"), std::string::npos);
}

TEST(CapturedStepErrors, ParametersOffTheGpuAreRefused) {
  torch::nn::Linear model(4, 4);
  ddp::optim::FusedAdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3));
  ddp::optim::FusedSGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  for (torch::optim::Optimizer* optimizer : std::vector<torch::optim::Optimizer*>{&adamw, &sgd}) {
    const std::string message = error_of(*optimizer);
    // LibTorch 1.13 has no fused kernels with a tensor learning rate; 2.x
    // refuses the CPU parameters.
    EXPECT_TRUE(message.find("move the model to the GPU") != std::string::npos ||
                message.find("needs LibTorch 2.2 or newer") != std::string::npos)
        << message;
  }
  EXPECT_FALSE(adamw.capturable());
}

TEST(CapturedStepErrors, AtLeastOneEagerStepComesFirst) {
  torch::nn::Linear model(4, 4);
  ddp::optim::FusedAdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  EXPECT_NE(error_of(optimizer, ddp::CapturedStepOptions().warmup_steps(0)).find("at least one eager step"),
            std::string::npos);
}

}  // namespace
