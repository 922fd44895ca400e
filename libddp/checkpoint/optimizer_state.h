#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <ddp/communicator.h>

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim
namespace torch::serialize {
class InputArchive;
class OutputArchive;
}  // namespace torch::serialize

namespace ddp::detail {

class ShardedParameters;

/// Writes into `archive`, on rank 0, the state `optimizer` holds for
/// `parameters` (named `names`) as one process would hold it: per parameter,
/// by name, its step and its state tensors in the parameter's shape. With
/// `sharded`, the ranks' fragments are gathered bucket by bucket, so no
/// device holds more than one bucket of a moment. Collective. SGD, Adam and
/// AdamW (and their fused versions) only: UsageError otherwise.
void save_optimizer_state(const torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& parameters,
                          const std::vector<std::string>& names, ShardedParameters* sharded, Communicator& comm,
                          torch::serialize::OutputArchive& archive);

/// Reads what save_optimizer_state() wrote, at any world size and sharding,
/// into `optimizer`'s state for this rank's parameters (with `sharded`, its
/// fragments). UsageError, naming the difference, when the archive holds
/// another optimizer's state or parameters this model does not have.
void load_optimizer_state(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& parameters,
                          const std::vector<std::string>& names, const ShardedParameters* sharded,
                          torch::serialize::InputArchive& archive);

}  // namespace ddp::detail
