#pragma once

// The checkpoint of a training run: model, optimizer, gradient scaler, step,
// data position and every rank's random number generators, written by rank 0
// atomically (ddp::checkpoint), so that a resumed run continues exactly where
// the interrupted one stopped.

#include <cstdint>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

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

/// Collective: every rank calls it (their generator states travel to rank 0).
void save_training_checkpoint(ddp::ProcessGroup& process_group, const std::string& path, torch::nn::Module& model,
                              torch::optim::Optimizer& optimizer, const ddp::GradScaler& scaler,
                              const TrainingState& state);

/// Loads into `model`, `optimizer`, `scaler` and `state` (step and data
/// position). `state.fingerprint` holds this run's fingerprint on entry;
/// a checkpoint of another run is a ddp::UsageError naming both.
void load_training_checkpoint(ddp::ProcessGroup& process_group, const std::string& path, torch::nn::Module& model,
                              torch::optim::Optimizer& optimizer, ddp::GradScaler& scaler, TrainingState& state);

}  // namespace examples
