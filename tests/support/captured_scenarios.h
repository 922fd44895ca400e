#pragma once

// ddp::CapturedStep against the same step run eagerly.

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <torch/arg.h>

#include <ddp/ddp.h>

namespace ddp::testing {

/// What check_captured_step_matches_eager trains. The default: fp32, one
/// micro-batch, plain DDP, FusedAdamW with a learning rate that changes
/// every step.
struct CapturedScenario {
  TORCH_ARG(int, steps) = 8;
  /// CapturedStepOptions::warmup_steps (a skipped warm-up step prolongs the warm-up).
  TORCH_ARG(int, warmup_steps) = 2;
  /// fp16 autocast and a ddp::GradScaler.
  TORCH_ARG(bool, grad_scaler) = false;
  /// Steps whose batch holds an inf: the scaler must skip them on every rank.
  TORCH_ARG(std::vector<int>, inf_steps) = {};
  /// The rank whose batch holds the inf; -1: every rank's.
  TORCH_ARG(int, inf_rank) = -1;
  /// Micro-batches per step, all but the last under no_sync().
  TORCH_ARG(int, micro_batches) = 1;
  /// Float8Linear layers with delayed scaling (bf16 autocast).
  TORCH_ARG(bool, float8) = false;
  TORCH_ARG(Sharding, sharding) = Sharding::kNone;
  /// The sharded modes: the dtype units are gathered and computed in (bf16 autocast).
  TORCH_ARG(std::optional<c10::ScalarType>, param_dtype) = std::nullopt;
  /// A third layer the forward never calls, under find_unused_parameters and
  /// static_graph (what a recorded step needs to skip it).
  TORCH_ARG(bool, unused_layer) = false;
  TORCH_ARG(double, tolerance) = 1e-6;
  /// Width of the hidden layer (wide: gradient buckets of megabytes).
  TORCH_ARG(int64_t, hidden) = 64;
};

/// How the captured copy ended against the eager one.
struct CapturedComparison {
  double difference = 0;                       ///< Largest over every step's loss and every parameter.
  double eager_scale = 1, captured_scale = 1;  ///< The GradScalers' final scales.
  std::int64_t eager_adamw_steps = 0, captured_adamw_steps = 0;  ///< AdamW's step count, read from the host state.
};

/// Two copies of one MLP (two units for Sharding::kFull) under DistributedDataParallel on `pg`, one stepped
/// eagerly and one through a CapturedStep, on this rank's batches: warm-up,
/// the recording, replays. Throws std::runtime_error when the step was never
/// recorded or the copies differ past the tolerance.
CapturedComparison check_captured_step_matches_eager(const std::shared_ptr<ProcessGroup>& pg,
                                                     const CapturedScenario& scenario = {});

}  // namespace ddp::testing
