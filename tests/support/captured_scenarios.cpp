#include "support/captured_scenarios.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace ddp::testing {
namespace {

torch::nn::Sequential make_mlp(const torch::Device& device) {
  torch::manual_seed(7);
  torch::nn::Sequential mlp(torch::nn::Linear(16, 32), torch::nn::ReLU(), torch::nn::Linear(32, 4));
  mlp->to(device);
  return mlp;
}

void zero_gradients(torch::nn::Module& module) {
  for (auto& parameter : module.parameters()) {
    if (parameter.grad().defined()) parameter.mutable_grad().zero_();
  }
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  static_cast<torch::optim::AdamWOptions&>(optimizer.param_groups().at(0).options()).lr(lr);
}

}  // namespace

double check_captured_step_matches_eager(const std::shared_ptr<ProcessGroup>& pg, int steps, double tolerance) {
  const torch::Device device = pg->device();
  DistributedDataParallel<torch::nn::Sequential> eager(make_mlp(device), pg);
  DistributedDataParallel<torch::nn::Sequential> captured(make_mlp(device), pg);
  optim::FusedAdamW eager_optimizer(eager.module()->parameters(), torch::optim::AdamWOptions(1e-2));
  optim::FusedAdamW captured_optimizer(captured.module()->parameters(), torch::optim::AdamWOptions(1e-2));
  CapturedStep step(
      captured_optimizer,
      [&](const std::vector<at::Tensor>& batch) {
        zero_gradients(*captured.module());
        at::Tensor loss = torch::mse_loss(captured(batch[0]), batch[1]);
        loss.backward();
        captured_optimizer.step();
        return loss;
      },
      CapturedStepOptions().warmup_steps(2).process_group(pg));

  double worst = 0;
  for (int i = 0; i < steps; ++i) {
    torch::manual_seed(100 * i + pg->rank());
    const at::Tensor x = torch::randn({64, 16}, device);
    const at::Tensor y = torch::randn({64, 4}, device);
    const double lr = 1e-2 / (1 + i);  // a schedule: every replay must read the new rate
    set_learning_rate(eager_optimizer, lr);
    set_learning_rate(captured_optimizer, lr);

    zero_gradients(*eager.module());
    const at::Tensor eager_loss = torch::mse_loss(eager(x), y);
    eager_loss.backward();
    eager_optimizer.step();
    const at::Tensor captured_loss = step({x, y}).clone();
    worst = std::max(worst, (eager_loss - captured_loss).abs().item<double>());
  }
  if (!step.captured()) throw std::runtime_error("the step was never recorded");
  const auto eager_parameters = eager.module()->parameters();
  const auto captured_parameters = captured.module()->parameters();
  for (std::size_t i = 0; i < eager_parameters.size(); ++i) {
    worst = std::max(worst, (eager_parameters[i] - captured_parameters[i]).abs().max().item<double>());
  }
  if (worst > tolerance) {
    throw std::runtime_error("captured step differs from the eager one by " + std::to_string(worst) + " (tolerance " +
                             std::to_string(tolerance) + ")");
  }
  return worst;
}

}  // namespace ddp::testing
