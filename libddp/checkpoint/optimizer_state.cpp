#include "checkpoint/optimizer_state.h"

#include <map>
#include <memory>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include <ddp/errors.h>

#include "optim/fused_step.h"
#include "sharding/sharded_parameters.h"

namespace ddp::detail {
namespace {

constexpr std::int64_t kFormat = 1;

/// The optimizers whose state libddp can write whole and split again.
enum class Kind { kAdamW, kAdam, kSgd };

const char* name_of(Kind kind) {
  switch (kind) {
    case Kind::kAdamW: return "adamw";
    case Kind::kAdam: return "adam";
    case Kind::kSgd: return "sgd";
  }
  return "";
}

Kind kind_of(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer) != nullptr) return Kind::kAdamW;
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer) != nullptr) return Kind::kAdam;
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer) != nullptr) return Kind::kSgd;
  throw UsageError(
      "libddp: checkpoints of the optimizer's state by parameter support SGD, Adam and AdamW (and "
      "ddp::optim::FusedSGD and FusedAdamW); save another optimizer's state with its own save() when the model is "
      "not sharded");
}

/// The state tensors an optimizer of `kind` keeps per parameter, as its options ask.
std::vector<std::string> tensor_names(Kind kind, const torch::optim::Optimizer& optimizer) {
  bool extra = false;
  for (const auto& group : optimizer.param_groups()) {
    if (kind == Kind::kAdamW) extra |= static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad();
    if (kind == Kind::kAdam) extra |= static_cast<const torch::optim::AdamOptions&>(group.options()).amsgrad();
    if (kind == Kind::kSgd) extra |= static_cast<const torch::optim::SGDOptions&>(group.options()).momentum() != 0;
  }
  if (kind == Kind::kSgd) return extra ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{};
  std::vector<std::string> names{"exp_avg", "exp_avg_sq"};
  if (extra) names.push_back("max_exp_avg_sq");
  return names;
}

/// One parameter's (or fragment's) state, whatever the optimizer.
struct State {
  std::int64_t step = -1;  ///< -1: none yet (SGD, which counts no steps: 0 once it has state).
  std::map<std::string, at::Tensor> tensors;
};

template <typename AdamState>
State read_adam(const AdamState& state) {
  return {state.step(), {{"exp_avg", state.exp_avg()}, {"exp_avg_sq", state.exp_avg_sq()},
                         {"max_exp_avg_sq", state.max_exp_avg_sq()}}};
}

template <typename AdamState>
std::unique_ptr<torch::optim::OptimizerParamState> make_adam(const State& state) {
  auto made = std::make_unique<AdamState>();
  made->step(state.step);
  made->exp_avg(state.tensors.at("exp_avg"));
  made->exp_avg_sq(state.tensors.at("exp_avg_sq"));
  if (auto it = state.tensors.find("max_exp_avg_sq"); it != state.tensors.end()) made->max_exp_avg_sq(it->second);
  return made;
}

State read_state(Kind kind, const torch::optim::Optimizer& optimizer, const at::Tensor& parameter) {
  const auto& states = optimizer.state();
  auto it = states.find(optim::detail::state_key<std::decay_t<decltype(states)>>(parameter));
  if (it == states.end()) return {};
  const torch::optim::OptimizerParamState& state = *it->second;
  switch (kind) {
    case Kind::kAdamW: return read_adam(static_cast<const torch::optim::AdamWParamState&>(state));
    case Kind::kAdam: return read_adam(static_cast<const torch::optim::AdamParamState&>(state));
    case Kind::kSgd:
      return {0, {{"momentum_buffer", static_cast<const torch::optim::SGDParamState&>(state).momentum_buffer()}}};
  }
  return {};
}

void write_state(Kind kind, torch::optim::Optimizer& optimizer, const at::Tensor& parameter, const State& state) {
  std::unique_ptr<torch::optim::OptimizerParamState> made;
  switch (kind) {
    case Kind::kAdamW: made = make_adam<torch::optim::AdamWParamState>(state); break;
    case Kind::kAdam: made = make_adam<torch::optim::AdamParamState>(state); break;
    case Kind::kSgd: {
      auto sgd = std::make_unique<torch::optim::SGDParamState>();
      if (auto it = state.tensors.find("momentum_buffer"); it != state.tensors.end()) sgd->momentum_buffer(it->second);
      made = std::move(sgd);
      break;
    }
  }
  auto& states = optimizer.state();
  states[optim::detail::state_key<std::decay_t<decltype(states)>>(parameter)] = std::move(made);
}

}  // namespace

void save_optimizer_state(const torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& parameters,
                          const std::vector<std::string>& names, ShardedParameters* sharded, Communicator& comm,
                          torch::serialize::OutputArchive& archive) {
  c10::NoGradGuard no_grad;
  const Kind kind = kind_of(optimizer);
  const std::vector<std::string> tensors = tensor_names(kind, optimizer);
  const bool writes = comm.rank() == 0;
  // What this rank steps for parameter i: the parameter, or its fragment here.
  auto stepped = [&](std::size_t i) { return sharded ? sharded->fragment_of(i) : parameters[i]; };

  // Steps: every rank with a part of a parameter counts the same steps.
  std::vector<std::int64_t> local_steps(parameters.size(), -1);
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const at::Tensor target = stepped(i);
    if (target.defined()) local_steps[i] = read_state(kind, optimizer, target).step;
  }
  at::Tensor steps = at::tensor(local_steps, at::kLong).to(comm.device());
  if (sharded) comm.all_reduce(steps, ReduceOp::kMax)->wait();
  steps = steps.cpu();
  const auto* step = steps.data_ptr<std::int64_t>();

  std::map<std::string, std::vector<at::Tensor>> whole;  // rank 0: per tensor name, per parameter
  for (const std::string& tensor : tensors) {
    std::vector<at::Tensor>& values = whole[tensor];
    values.resize(parameters.size());
    auto keep = [&](std::size_t i, const at::Tensor& value) {
      if (writes && step[i] >= 0) values[i] = value.contiguous().cpu();
    };
    if (sharded) {
      sharded->gather_whole(
          [&](std::size_t i) { return read_state(kind, optimizer, stepped(i)).tensors[tensor]; }, keep);
    } else {
      for (std::size_t i = 0; i < parameters.size(); ++i) keep(i, read_state(kind, optimizer, parameters[i]).tensors[tensor]);
    }
  }
  if (!writes) return;
  archive.write("format", c10::IValue(kFormat));
  archive.write("optimizer", c10::IValue(std::string(name_of(kind))));
  std::int64_t count = 0;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    if (step[i] < 0) continue;  // never stepped: no state, as in one process
    torch::serialize::OutputArchive entry;
    entry.write("name", c10::IValue(names[i]));
    entry.write("step", c10::IValue(step[i]));
    for (const std::string& tensor : tensors) entry.write(tensor, whole[tensor][i]);
    archive.write(fmt::format("p{}", count++), entry);
  }
  archive.write("parameters", c10::IValue(count));
}

void load_optimizer_state(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& parameters,
                          const std::vector<std::string>& names, const ShardedParameters* sharded,
                          torch::serialize::InputArchive& archive) {
  c10::NoGradGuard no_grad;
  const Kind kind = kind_of(optimizer);
  const std::vector<std::string> tensors = tensor_names(kind, optimizer);
  c10::IValue format, saved_kind, count;
  if (!archive.try_read("format", format) || format.toInt() != kFormat || !archive.try_read("optimizer", saved_kind) ||
      !archive.try_read("parameters", count)) {
    throw UsageError("libddp: the checkpoint holds no optimizer state written by save_optimizer_state()");
  }
  if (saved_kind.toStringRef() != name_of(kind)) {
    throw UsageError(fmt::format("libddp: the checkpoint holds the state of the optimizer {}; this one is {}",
                                 saved_kind.toStringRef(), name_of(kind)));
  }
  std::map<std::string, std::size_t> index_of;
  for (std::size_t i = 0; i < names.size(); ++i) index_of[names[i]] = i;
  for (std::int64_t n = 0; n < count.toInt(); ++n) {
    torch::serialize::InputArchive entry;
    archive.read(fmt::format("p{}", n), entry);
    c10::IValue name, step;
    entry.read("name", name);
    entry.read("step", step);
    auto it = index_of.find(name.toStringRef());
    if (it == index_of.end()) {
      throw UsageError(fmt::format("libddp: the checkpoint's optimizer state is for a parameter '{}' that this model "
                                   "does not train; it belongs to another model",
                                   name.toStringRef()));
    }
    const at::Tensor& parameter = parameters[it->second];
    const at::Tensor target = sharded ? sharded->fragment_of(it->second) : parameter;
    State state{step.toInt(), {}};
    for (const std::string& tensor : tensors) {
      at::Tensor value;
      if (!entry.try_read(tensor, value)) {
        throw UsageError(fmt::format("libddp: the checkpoint's optimizer state of '{}' has no '{}': it was written "
                                     "with other optimizer options",
                                     name.toStringRef(), tensor));
      }
      if (value.sizes() != parameter.sizes()) {
        throw UsageError(fmt::format("libddp: the checkpoint's optimizer state of '{}' has shape [{}], the parameter "
                                     "[{}]; it belongs to another model",
                                     name.toStringRef(), fmt::join(value.sizes(), ", "),
                                     fmt::join(parameter.sizes(), ", ")));
      }
      if (!target.defined()) continue;
      state.tensors[tensor] = sharded ? sharded->part_of(it->second, value)
                                      : at::empty_like(parameter, at::MemoryFormat::Preserve).copy_(value);
    }
    if (target.defined()) write_state(kind, optimizer, target, state);
  }
}

}  // namespace ddp::detail
