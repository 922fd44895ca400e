#pragma once

// The checkpoint of a training run: model, optimizer, gradient scaler, step,
// data position and every rank's random number generators, written by rank 0
// atomically (ddp::checkpoint), so that a resumed run continues exactly where
// the interrupted one stopped.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/serialize/archive.h>

#include <ddp/distributed_data_parallel.h>
#include <ddp/grad_scaler.h>
#include <ddp/process_group.h>

namespace examples {

struct TrainingState {
  std::int64_t step = 0;                    ///< Optimizer steps done.
  std::vector<std::int64_t> data_position;  ///< The data source's position, opaque here.
  /// What the run is (model shape, precision, world size, batch): a resume
  /// with a different one is refused, naming both.
  std::string fingerprint;
};

/// The optimizer's state in and out of a checkpoint: the model's
/// DistributedDataParallel::save_optimizer_state / load_optimizer_state, the
/// same format whether the state is sharded or not. save is collective, and
/// leaves the module's parameters whole for saving.
struct OptimizerCheckpointing {
  std::function<void(torch::serialize::OutputArchive&)> save;
  std::function<void(torch::serialize::InputArchive&)> load;
};

/// The OptimizerCheckpointing of `optimizer` (built over model.parameters()).
template <typename Module>
OptimizerCheckpointing optimizer_checkpointing(ddp::DistributedDataParallel<Module>& model,
                                               torch::optim::Optimizer& optimizer) {
  return {[&model, &optimizer](torch::serialize::OutputArchive& archive) {
            model.gather_parameters();  // sharded: the optimizer stepped only this rank's shards
            model.save_optimizer_state(optimizer, archive);
          },
          [&model, &optimizer](torch::serialize::InputArchive& archive) {
            model.load_optimizer_state(optimizer, archive);
          }};
}

/// Collective: every rank calls it (their generator states and, sharded,
/// their parts of the optimizer state travel to rank 0).
void save_training_checkpoint(ddp::ProcessGroup& process_group, const std::string& path, torch::nn::Module& model,
                              const OptimizerCheckpointing& optimizer, const ddp::GradScaler& scaler,
                              const TrainingState& state);

/// Loads into `model`, the optimizer, `scaler` and `state` (step and data
/// position). `state.fingerprint` holds this run's fingerprint on entry;
/// a checkpoint of another run is a ddp::UsageError naming both.
void load_training_checkpoint(ddp::ProcessGroup& process_group, const std::string& path, torch::nn::Module& model,
                              const OptimizerCheckpointing& optimizer, ddp::GradScaler& scaler, TrainingState& state);

}  // namespace examples
