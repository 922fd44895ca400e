#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <ddp/communicator.h>

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace ddp::detail {

class ShardedParameters;

/// The optimizers whose per-parameter state libddp checkpoints by name and
/// splits again at another sharding or world size: elementwise ones only.
enum class OptimizerKind { kAdamW, kAdam, kSgd };

/// "adamw", "adam", "sgd": the name checkpoints record.
const char* name_of(OptimizerKind kind);
/// UsageError naming the supported ones for any other optimizer.
OptimizerKind kind_of(const torch::optim::Optimizer& optimizer);
/// The state tensors an optimizer of `kind` keeps per parameter, as its
/// options ask (AdamW's amsgrad adds max_exp_avg_sq, SGD's momentum its buffer).
std::vector<std::string> state_tensor_names(OptimizerKind kind, const torch::optim::Optimizer& optimizer);

/// One parameter's (or fragment's) state, whatever the optimizer.
struct ParamState {
  std::int64_t step = -1;  ///< -1: none yet (SGD, which counts no steps: 0 once it has state).
  std::map<std::string, at::Tensor> tensors;
};

/// The state `optimizer` keeps for `parameter`; step -1 if it has none.
ParamState read_param_state(OptimizerKind kind, const torch::optim::Optimizer& optimizer, const at::Tensor& parameter);
/// Replaces the state `optimizer` keeps for `parameter` with `state`.
void write_param_state(OptimizerKind kind, torch::optim::Optimizer& optimizer, const at::Tensor& parameter,
                       const ParamState& state);
/// Forgets the state `optimizer` keeps for `parameter`, as before its first step.
void erase_param_state(torch::optim::Optimizer& optimizer, const at::Tensor& parameter);

/// What this rank's optimizer steps for trained parameter `index`: the
/// parameter itself, or with `sharded` its fragment here (undefined: none).
at::Tensor stepped_part(const std::vector<at::Tensor>& parameters, const ShardedParameters* sharded, std::size_t index);

/// Per trained parameter, the step count of the state `optimizer` keeps for
/// it (-1: none yet), the same on every rank: with `sharded`, a rank that
/// steps no part of a parameter learns it from one that does (collective).
std::vector<std::int64_t> agreed_steps(OptimizerKind kind, const torch::optim::Optimizer& optimizer,
                                       const std::vector<at::Tensor>& parameters, const ShardedParameters* sharded,
                                       Communicator& comm);

}  // namespace ddp::detail
