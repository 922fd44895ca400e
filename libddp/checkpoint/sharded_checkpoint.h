#pragma once

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <ddp/process_group.h>

namespace torch::nn {
class Module;
}  // namespace torch::nn
namespace torch::optim {
class Optimizer;
}  // namespace torch::optim
namespace torch::serialize {
class InputArchive;
class OutputArchive;
}  // namespace torch::serialize

namespace ddp::detail {

class ShardedParameters;

/// The training state a sharded checkpoint holds of one wrapped model.
struct CheckpointedModel {
  torch::nn::Module& module;
  const std::vector<at::Tensor>& trained;  ///< Each trained parameter once.
  const std::vector<std::string>& names;   ///< Their names.
  ShardedParameters* sharded;              ///< Null: every rank holds them whole (Sharding::kNone).
  std::string sharding;                    ///< The mode's name, recorded in the manifest.
};

/// Writes a sharded checkpoint into `directory`: one file per rank with the
/// parts of the trained parameters (and of their optimizer state) that rank
/// steps — with kNone an equal split of each — and a manifest, written last
/// by rank 0, that says which file holds which part of which parameter and
/// holds the replicated tensors (buffers, frozen parameters) and `extra`.
/// Every file is written atomically, and the manifest's rename commits the
/// checkpoint: a crash before it leaves the previous checkpoint whole. Files
/// of earlier checkpoints are removed afterwards. `extra` runs on rank 0 only.
/// `directory` must be one
/// that every rank sees (a shared filesystem). Collective.
void save_sharded_checkpoint(const CheckpointedModel& model, ProcessGroup& process_group,
                             const torch::optim::Optimizer* optimizer, const std::string& directory,
                             const std::function<void(torch::serialize::OutputArchive&)>& extra);

/// Loads what save_sharded_checkpoint() wrote, at any world size and in any
/// sharding mode: each rank reads only the files that hold a part of what it
/// steps. UsageError naming the difference for a checkpoint of another model
/// or optimizer, a missing, truncated or foreign file. `extra` reads on every
/// rank what it wrote (and must run no collective). Collective: a failure
/// on one rank is an error on every rank.
void load_sharded_checkpoint(const CheckpointedModel& model, ProcessGroup& process_group,
                             torch::optim::Optimizer* optimizer, const std::string& directory,
                             const std::function<void(torch::serialize::InputArchive&)>& extra);

}  // namespace ddp::detail
