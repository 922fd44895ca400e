#pragma once

// The checkpoint of a training run: model, optimizer, gradient scaler, step,
// data position and every rank's random number generators, written by rank 0
// atomically (ddp::checkpoint), so that a resumed run continues exactly where
// the interrupted one stopped.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

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

/// The module and its optimizer's state in and out of a checkpoint, through
/// the DistributedDataParallel wrapper, in either format:
/// - whole: save_module() and save_optimizer_state(), gathered one bucket at
///   a time to rank 0, which writes one file;
/// - sharded: save_sharded_checkpoint(), a directory with one file per rank,
///   written in parallel, and a manifest; `extra` (rank 0) adds the rest.
/// Both load in any sharding mode at any world size. Saves are collective.
struct ModelCheckpointing {
  using Extra = std::function<void(torch::serialize::OutputArchive&)>;
  using ReadExtra = std::function<void(torch::serialize::InputArchive&)>;
  std::function<void(torch::serialize::OutputArchive& module, torch::serialize::OutputArchive& optimizer)> save;
  std::function<void(torch::serialize::InputArchive& module, torch::serialize::InputArchive& optimizer)> load;
  std::function<void(const std::string& directory, const Extra& extra)> save_sharded;
  std::function<void(const std::string& directory, const ReadExtra& extra)> load_sharded;
};

/// The ModelCheckpointing of `model` and `optimizer` (built over model.parameters()).
template <typename Module>
ModelCheckpointing model_checkpointing(ddp::DistributedDataParallel<Module>& model,
                                       torch::optim::Optimizer& optimizer) {
  return {[&model, &optimizer](torch::serialize::OutputArchive& module, torch::serialize::OutputArchive& state) {
            model.save_module(module);
            model.save_optimizer_state(optimizer, state);
          },
          [&model, &optimizer](torch::serialize::InputArchive& module, torch::serialize::InputArchive& state) {
            model.load_module(module);
            model.load_optimizer_state(optimizer, state);
          },
          [&model, &optimizer](const std::string& directory, const ModelCheckpointing::Extra& extra) {
            model.save_sharded_checkpoint(directory, &optimizer, extra);
          },
          [&model, &optimizer](const std::string& directory, const ModelCheckpointing::ReadExtra& extra) {
            model.load_sharded_checkpoint(directory, &optimizer, extra);
          }};
}

/// How the examples write checkpoints (--checkpoint-format).
enum class CheckpointFormat { kWhole, kSharded };

/// Whether `path` holds a checkpoint in `format` to resume from.
bool checkpoint_exists(const std::string& path, CheckpointFormat format);

/// Collective: every rank calls it (their generator states travel to rank 0,
/// and, whole, their parts of a sharded model and optimizer state too).
void save_training_checkpoint(ddp::ProcessGroup& process_group, const std::string& path, CheckpointFormat format,
                              const ModelCheckpointing& model, const ddp::GradScaler& scaler,
                              const TrainingState& state);

/// Loads into `model`, the optimizer, `scaler` and `state` (step and data
/// position). `state.fingerprint` holds this run's fingerprint on entry;
/// a checkpoint of another run is a ddp::UsageError naming both.
void load_training_checkpoint(ddp::ProcessGroup& process_group, const std::string& path, CheckpointFormat format,
                              const ModelCheckpointing& model, ddp::GradScaler& scaler, TrainingState& state);

/// Refuses, before the first step, a `path` the saves could not write
/// (found at the first save, it would cost the training done so far): the
/// ranks that write (rank 0 for a whole checkpoint, every rank for a sharded
/// one) create its folder and a file in it. Collective.
void check_checkpoint_writable(ddp::ProcessGroup& process_group, const std::string& path, CheckpointFormat format);

}  // namespace examples
