// ddp::CapturedStep on one GPU: a recorded and replayed DDP step trains as
// the eager one, and what cannot be recorded is a clear error.

#include <chrono>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "support/captured_scenarios.h"
#include "support/multiprocess.h"

namespace {

using namespace ddp::testing;

std::shared_ptr<ddp::ProcessGroup> init_nccl() {
  return ddp::init(ddp::InitOptions().backend(ddp::Backend::kNccl).timeout(std::chrono::seconds(60)));
}

/// The message of the UsageError `run` throws; empty if none.
template <typename Run>
std::string usage_error_of(Run&& run) {
  try {
    run();
  } catch (const ddp::UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(CapturedStep, ReplaysTrainAsTheEagerStepOnOneGpu) {
  expect_all_succeeded(run_ranks(1, [](int) {
    const double difference = check_captured_step_matches_eager(init_nccl(), /*steps=*/8, /*tolerance=*/1e-6);
    std::printf("captured vs eager, 1 GPU: largest difference %.3g\n", difference);
  }));
}

TEST(CapturedStep, ShapeChangesAndHostSyncsAreUsageErrors) {
  const torch::Device gpu(torch::kCUDA, 0);
  torch::nn::Linear model(8, 8);
  model->to(gpu);
  ddp::optim::FusedSGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  ddp::CapturedStep step(
      optimizer,
      [&](const std::vector<at::Tensor>& batch) {
        optimizer.zero_grad(/*set_to_none=*/false);
        at::Tensor loss = model(batch[0]).square().mean();
        loss.backward();
        optimizer.step();
        return loss;
      },
      ddp::CapturedStepOptions().warmup_steps(1));
  step({torch::randn({4, 8}, gpu)});
  step({torch::randn({4, 8}, gpu)});
  ASSERT_TRUE(step.captured());
  const std::string shape = usage_error_of([&] { step({torch::randn({6, 8}, gpu)}); });
  EXPECT_NE(shape.find("call reset()"), std::string::npos) << shape;
  const std::string host = usage_error_of([&] { step({torch::randn({4, 8})}); });
  EXPECT_NE(host.find("move the batch to the GPU"), std::string::npos) << host;
  // Recorded anew for the new shape.
  step.reset();
  step({torch::randn({6, 8}, gpu)});
  step({torch::randn({6, 8}, gpu)});
  EXPECT_TRUE(step.captured());

  // A step that reads a value on the host cannot be recorded.
  ddp::CapturedStep syncing(
      optimizer,
      [&](const std::vector<at::Tensor>& batch) {
        optimizer.zero_grad(/*set_to_none=*/false);
        at::Tensor loss = model(batch[0]).square().mean();
        if (loss.item<float>() < 0) loss = -loss;
        loss.backward();
        optimizer.step();
        return loss;
      },
      ddp::CapturedStepOptions().warmup_steps(1));
  syncing({torch::randn({4, 8}, gpu)});
  const std::string sync = usage_error_of([&] { syncing({torch::randn({4, 8}, gpu)}); });
  EXPECT_NE(sync.find("could not be recorded into a CUDA graph"), std::string::npos) << sync;
  EXPECT_FALSE(syncing.captured());
}

}  // namespace
