#include "support/captured_scenarios.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace ddp::testing {
namespace {

constexpr int64_t kRows = 64, kIn = 32, kOut = 16;  // FP8 needs multiples of 16

/// Two Float8Linear layers (plain Linear unless FP8 is on), each run as a
/// unit, which Sharding::kFull gathers and frees around it; optionally a
/// third that the forward never calls.
struct UnitMlpImpl : torch::nn::Module {
  UnitMlpImpl(bool float8, bool unused_layer, int64_t hidden) {
    const auto recipe = Float8Options().scaling(Float8Scaling::kDelayed).amax_history_len(16).enabled(float8);
    first = register_module("first", Float8Linear(torch::nn::LinearOptions(kIn, hidden), recipe));
    second = register_module("second", Float8Linear(torch::nn::LinearOptions(hidden, kOut), recipe));
    if (unused_layer) register_module("unused", torch::nn::Linear(hidden, hidden));
  }
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor hidden = torch::relu(in_unit(*first, [&] { return first(x); }));
    return in_unit(*second, [&] { return second(hidden); });
  }
  Float8Linear first{nullptr}, second{nullptr};
};
TORCH_MODULE(UnitMlp);

using Model = DistributedDataParallel<UnitMlp>;

UnitMlp make_mlp(const torch::Device& device, const CapturedScenario& scenario) {
  torch::manual_seed(7);
  UnitMlp mlp(scenario.float8(), scenario.unused_layer(), scenario.hidden());
  mlp->to(device);
  return mlp;
}

DistributedDataParallelOptions model_options(const CapturedScenario& scenario) {
  auto options = DistributedDataParallelOptions().sharding(scenario.sharding());
  // param_dtype narrows the units' parameters, in every sharded mode.
  if (scenario.sharding() == Sharding::kFull || scenario.param_dtype()) options.shard_units({"first", "second"});
  if (scenario.unused_layer()) options.find_unused_parameters(true).static_graph(true);
  return options.param_dtype(scenario.param_dtype());
}

PrecisionPolicy policy_of(const CapturedScenario& scenario) {
  if (scenario.float8()) return Precision::kFp8;
  if (scenario.param_dtype()) return Precision::kBf16;  // inputs meet the narrower units under autocast
  return scenario.grad_scaler() ? Precision::kFp16 : Precision::kFp32;
}

/// The largest elementwise difference; NaN against NaN (a skipped step's
/// loss) counts as equal, NaN against a number as infinitely far.
double gap(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor difference = (a - b).abs().masked_fill(a.isnan() & b.isnan(), 0).masked_fill(a.eq(b), 0);
  const double worst = difference.max().item<double>();
  return std::isnan(worst) ? INFINITY : worst;
}

/// One copy: the model, its optimizer and its scaler, and the step both copies run.
struct Replica {
  Replica(const std::shared_ptr<ProcessGroup>& pg, const CapturedScenario& scenario)
      : pg(pg),
        scenario(scenario),
        policy(policy_of(scenario)),
        model(make_mlp(pg->device(), scenario), pg, model_options(scenario)),
        optimizer(model.parameters(), torch::optim::AdamWOptions(1e-2)),
        scaler(GradScalerOptions().enabled(scenario.grad_scaler()), pg) {}

  at::Tensor step(const std::vector<at::Tensor>& batch) {
    for (auto& parameter : model.parameters()) {
      if (parameter.grad().defined()) parameter.mutable_grad().zero_();
    }
    const int64_t rows = batch[0].size(0) / scenario.micro_batches();
    at::Tensor total = torch::zeros({}, batch[0].options());
    for (int micro = 0; micro < scenario.micro_batches(); ++micro) {
      std::optional<Model::NoSyncGuard> no_sync;
      if (micro + 1 < scenario.micro_batches()) no_sync.emplace(model.no_sync());
      at::Tensor loss;
      {
        PrecisionGuard guard(policy, pg->device());
        const at::Tensor output = model(batch[0].narrow(0, micro * rows, rows));
        loss = torch::mse_loss(output.to(torch::kFloat), batch[1].narrow(0, micro * rows, rows)) /
               scenario.micro_batches();
      }
      scaler.scale(loss).backward();
      total = total + loss.detach();
    }
    if (scenario.float8()) float8::all_reduce_amaxes(*model.module(), *pg);
    scaler.step(optimizer);
    scaler.update();
    return total;
  }

  void set_learning_rate(double lr) {
    static_cast<torch::optim::AdamWOptions&>(optimizer.param_groups().at(0).options()).lr(lr);
  }

  /// The largest AdamW step count in the host state.
  int64_t adamw_steps() const {
    optimizer.sync_host_state();
    int64_t steps = 0;
    for (const auto& [key, state] : optimizer.state()) {
      steps = std::max(steps, static_cast<const torch::optim::AdamWParamState&>(*state).step());
    }
    return steps;
  }

  std::shared_ptr<ProcessGroup> pg;
  CapturedScenario scenario;
  PrecisionPolicy policy;
  Model model;
  optim::FusedAdamW optimizer;
  GradScaler scaler;
};

}  // namespace

CapturedComparison check_captured_step_matches_eager(const std::shared_ptr<ProcessGroup>& pg,
                                                     const CapturedScenario& scenario) {
  const torch::Device device = pg->device();
  Replica eager(pg, scenario);
  Replica captured(pg, scenario);
  CapturedStep step(
      captured.optimizer, [&](const std::vector<at::Tensor>& batch) { return captured.step(batch); },
      CapturedStepOptions().warmup_steps(scenario.warmup_steps()).process_group(pg));

  CapturedComparison result;
  const int64_t rows = kRows * scenario.micro_batches();
  for (int i = 0; i < scenario.steps(); ++i) {
    torch::manual_seed(100 * i + pg->rank());
    const at::Tensor x = torch::randn({rows, kIn}, device);
    const at::Tensor y = torch::randn({rows, kOut}, device);
    const auto& inf_steps = scenario.inf_steps();
    const bool inf_here = scenario.inf_rank() < 0 || scenario.inf_rank() == pg->rank();
    if (inf_here && std::find(inf_steps.begin(), inf_steps.end(), i) != inf_steps.end()) {
      // FP8's input cast saturates an inf (as Transformer Engine's does),
      // leaving every gradient finite; one in the target reaches the bias
      // gradients, which no cast touches.
      (scenario.float8() ? y : x)[0][0] = INFINITY;
    }
    const double lr = 1e-2 / (1 + i);  // a schedule: every replay must read the new rate
    eager.set_learning_rate(lr);
    captured.set_learning_rate(lr);

    const at::Tensor eager_loss = eager.step({x, y});
    const at::Tensor captured_loss = step({x, y}).clone();
    result.difference = std::max(result.difference, gap(eager_loss, captured_loss));
  }
  if (!step.captured()) throw std::runtime_error("the step was never recorded");
  // kFull's units hold no memory between steps: gather them to read them.
  eager.model.gather_parameters();
  captured.model.gather_parameters();
  const auto eager_parameters = eager.model.module()->parameters();
  const auto captured_parameters = captured.model.module()->parameters();
  for (std::size_t i = 0; i < eager_parameters.size(); ++i) {
    result.difference = std::max(result.difference, gap(eager_parameters[i], captured_parameters[i]));
  }
  result.eager_scale = eager.scaler.get_scale();
  result.captured_scale = captured.scaler.get_scale();
  result.eager_adamw_steps = eager.adamw_steps();
  result.captured_adamw_steps = captured.adamw_steps();
  if (result.difference > scenario.tolerance()) {
    throw std::runtime_error("captured step differs from the eager one by " + std::to_string(result.difference) +
                             " (tolerance " + std::to_string(scenario.tolerance()) + ")");
  }
  return result;
}

}  // namespace ddp::testing
