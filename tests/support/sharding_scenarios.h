#pragma once

// Sharded data parallelism (ZeRO-1, 2 and 3) against plain DDP and one process, on
// any backend. Each rank trains three models side by side on the same
// batches with AdamW: DDP in the scenario's sharding mode, plain DDP, and a
// single-process reference that accumulates the gradients of every rank's
// batches. After K steps all three must agree. Each throws std::runtime_error.

#include <optional>
#include <string>

#include <ddp/ddp.h>

namespace ddp::testing {

enum class ShardedModel {
  kMlp,      ///< two linear layers
  kBranchy,  ///< a head that some ranks skip on some steps (find_unused_parameters)
  kTied,     ///< one weight registered in two modules and used twice
  kFrozen,   ///< the first layer's weight does not require a gradient
};

struct ShardingScenario {
  ShardedModel model = ShardedModel::kMlp;
  Sharding sharding = Sharding::kOptimizer;
  DistributedDataParallelOptions options;  ///< Its sharding is set from `sharding`.
  /// The layers as shard units in kOptimizer and kGradients too (kFull
  /// always has them), where they pace the parameters' gathers.
  bool units = false;
  int width = 33;             ///< Hidden width: 33 makes element counts divisible by no world size.
  int steps = 3;
  int micro_steps = 1;        ///< > 1: the first micro_steps - 1 backward passes run under no_sync()
  double clip = 0;            ///< > 0: clip_grad_norm_ to this before each step
  /// gather_parameters() between backward and each step (as a caller that
  /// logs the weights does): the step that follows must still reach the
  /// next forward.
  bool gather_before_step = false;
  /// ddp::optim::FusedAdamW for all three (its fused kernel on CUDA) instead of torch::optim::AdamW.
  bool fused_optimizer = false;
  double tolerance = 1e-6;    ///< max abs difference of any parameter
  /// Against the one process, where DDP's reduction itself rounds (bf16
  /// hooks); no lower than `tolerance`.
  double reference_tolerance = 0;
};

/// Returns the largest difference to the reference; throws if over the tolerance.
double check_sharded_matches(ProcessGroup& pg, const ShardingScenario& scenario);

/// Every sharded mode on one rank, where nothing is reduced: in many small
/// buckets, and with an unused branch, accumulation and clipping; then the
/// memory report. `fused`: with ddp::optim::FusedAdamW.
void check_every_mode_on_one_rank(ProcessGroup& pg, bool fused);

/// memory_report() of each mode: the optimizer's elements and state, and in
/// kGradients the gradients, are 1/N of the model's (padding aside).
void check_memory_report(ProcessGroup& pg);

/// How check_units_gather_one_at_a_time gathers and reduces.
struct UnitGathering {
  Sharding sharding = Sharding::kFull;         ///< kOptimizer and kGradients keep the units resident.
  std::optional<c10::ScalarType> param_dtype;  ///< Gather the units in it (unset: fp32).
  CommHook comm_hook = nullptr;                ///< Unset: average().
  double tolerance = 1e-6;                     ///< Of the fp32 masters against one process.
};

/// Six equal layers, each a unit: trains as one process (SGD), runs the
/// units in the param_dtype and steps fp32 masters; in Sharding::kFull holds
/// at most two units gathered at once.
void check_units_gather_one_at_a_time(ProcessGroup& pg, const UnitGathering& gathering = {});

/// How a checkpoint holds the model and its optimizer state.
enum class CheckpointFormat {
  kWhole,    ///< save_module and save_optimizer_state, in one file rank 0 writes
  kSharded,  ///< save_sharded_checkpoint: a directory, one file per rank and a manifest
};

/// Checkpoints across modes and world sizes. Every step's global batch is 12
/// samples, split evenly over the ranks (1, 2, 3 or 4), so a run at any world
/// size trains the same model. save_after_steps trains `steps` steps in
/// `sharding` and saves the module and the optimizer state to `path`;
/// check_resume_matches loads it in `sharding` at this world size, trains one
/// more step, and compares with one process that trained steps + 1 steps.
/// AdamW, fused on a GPU.
void save_after_steps(ProcessGroup& pg, Sharding sharding, int steps, const std::string& path,
                      CheckpointFormat format = CheckpointFormat::kWhole);
void check_resume_matches(ProcessGroup& pg, Sharding sharding, int steps, const std::string& path,
                          CheckpointFormat format = CheckpointFormat::kWhole);

/// A GradScaler over sharded gradients: an inf in one rank's shard makes
/// every rank skip the step, and the ranks stay equal.
void check_grad_scaler_agrees(ProcessGroup& pg, Sharding sharding);

}  // namespace ddp::testing
