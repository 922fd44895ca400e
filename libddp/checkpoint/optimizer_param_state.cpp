#include "checkpoint/optimizer_param_state.h"

#include <algorithm>
#include <memory>
#include <type_traits>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <ddp/errors.h>

#include "optim/fused_step.h"
#include "sharding/sharded_parameters.h"

namespace ddp::detail {
namespace {

template <typename AdamState>
ParamState read_adam(const AdamState& state) {
  return {
      state.step(),
      {{"exp_avg", state.exp_avg()}, {"exp_avg_sq", state.exp_avg_sq()}, {"max_exp_avg_sq", state.max_exp_avg_sq()}}};
}

template <typename AdamState>
std::unique_ptr<torch::optim::OptimizerParamState> make_adam(const ParamState& state) {
  auto made = std::make_unique<AdamState>();
  made->step(state.step);
  made->exp_avg(state.tensors.at("exp_avg"));
  made->exp_avg_sq(state.tensors.at("exp_avg_sq"));
  if (auto it = state.tensors.find("max_exp_avg_sq"); it != state.tensors.end()) made->max_exp_avg_sq(it->second);
  return made;
}

template <typename StateMap>
typename StateMap::key_type key_of(const StateMap&, const at::Tensor& parameter) {
  return optim::detail::state_key<StateMap>(parameter);
}

}  // namespace

const char* name_of(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdamW: return "adamw";
    case OptimizerKind::kAdam: return "adam";
    case OptimizerKind::kSgd: return "sgd";
  }
  return "";
}

OptimizerKind kind_of(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer) != nullptr) return OptimizerKind::kAdamW;
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer) != nullptr) return OptimizerKind::kAdam;
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer) != nullptr) return OptimizerKind::kSgd;
  throw UsageError(
      "libddp: checkpoints of the optimizer's state by parameter support SGD, Adam and AdamW (and ddp::optim::FusedSGD "
      "and FusedAdamW); save another optimizer's state with its own save() when the model is not sharded");
}

std::vector<std::string> state_tensor_names(OptimizerKind kind, const torch::optim::Optimizer& optimizer) {
  // Whether each group keeps the optional tensor (amsgrad's maximum, SGD's momentum).
  std::vector<bool> extra;
  for (const auto& group : optimizer.param_groups()) {
    switch (kind) {
      case OptimizerKind::kAdamW:
        extra.push_back(static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad());
        break;
      case OptimizerKind::kAdam:
        extra.push_back(static_cast<const torch::optim::AdamOptions&>(group.options()).amsgrad());
        break;
      case OptimizerKind::kSgd:
        extra.push_back(static_cast<const torch::optim::SGDOptions&>(group.options()).momentum() != 0);
        break;
    }
  }
  const bool any = std::find(extra.begin(), extra.end(), true) != extra.end();
  if (any && std::find(extra.begin(), extra.end(), false) != extra.end()) {
    throw UsageError(fmt::format(
        "libddp: checkpoints of the optimizer's state need {} in every parameter group or in none; {} of {} groups "
        "have it",
        kind == OptimizerKind::kSgd ? "momentum" : "amsgrad", std::count(extra.begin(), extra.end(), true),
        extra.size()));
  }
  if (kind == OptimizerKind::kSgd)
    return any ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{};
  std::vector<std::string> names{"exp_avg", "exp_avg_sq"};
  if (any) names.push_back("max_exp_avg_sq");
  return names;
}

ParamState read_param_state(OptimizerKind kind, const torch::optim::Optimizer& optimizer, const at::Tensor& parameter) {
  const auto& states = optimizer.state();
  auto it = states.find(key_of(states, parameter));
  if (it == states.end()) return {};
  const torch::optim::OptimizerParamState& state = *it->second;
  switch (kind) {
    case OptimizerKind::kAdamW: return read_adam(static_cast<const torch::optim::AdamWParamState&>(state));
    case OptimizerKind::kAdam: return read_adam(static_cast<const torch::optim::AdamParamState&>(state));
    case OptimizerKind::kSgd:
      return {0, {{"momentum_buffer", static_cast<const torch::optim::SGDParamState&>(state).momentum_buffer()}}};
  }
  return {};
}

void write_param_state(OptimizerKind kind, torch::optim::Optimizer& optimizer, const at::Tensor& parameter,
                       const ParamState& state) {
  std::unique_ptr<torch::optim::OptimizerParamState> made;
  switch (kind) {
    case OptimizerKind::kAdamW: made = make_adam<torch::optim::AdamWParamState>(state); break;
    case OptimizerKind::kAdam: made = make_adam<torch::optim::AdamParamState>(state); break;
    case OptimizerKind::kSgd: {
      auto sgd = std::make_unique<torch::optim::SGDParamState>();
      if (auto it = state.tensors.find("momentum_buffer"); it != state.tensors.end()) sgd->momentum_buffer(it->second);
      made = std::move(sgd);
      break;
    }
  }
  auto& states = optimizer.state();
  states[key_of(states, parameter)] = std::move(made);
}

void erase_param_state(torch::optim::Optimizer& optimizer, const at::Tensor& parameter) {
  auto& states = optimizer.state();
  states.erase(key_of(states, parameter));
}

at::Tensor stepped_part(const std::vector<at::Tensor>& parameters, const ShardedParameters* sharded,
                        std::size_t index) {
  return sharded != nullptr ? sharded->fragment_of(index) : parameters[index];
}

std::vector<std::int64_t> agreed_steps(OptimizerKind kind, const torch::optim::Optimizer& optimizer,
                                       const std::vector<at::Tensor>& parameters, const ShardedParameters* sharded,
                                       Communicator& comm) {
  std::vector<std::int64_t> local(parameters.size(), -1);
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const at::Tensor target = stepped_part(parameters, sharded, i);
    if (target.defined()) local[i] = read_param_state(kind, optimizer, target).step;
  }
  if (sharded == nullptr) return local;  // every rank steps every parameter
  at::Tensor steps = at::tensor(local, at::kLong).to(comm.device());
  comm.all_reduce(steps, ReduceOp::kMax)->wait();
  steps = steps.cpu();
  return {steps.data_ptr<std::int64_t>(), steps.data_ptr<std::int64_t>() + steps.numel()};
}

}  // namespace ddp::detail
