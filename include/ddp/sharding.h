#pragma once

#include <cstdint>
#include <string>

#include <ddp/export.h>

namespace ddp {

/// What of the training state each rank keeps whole, as ZeRO's stages.
/// Every mode trains the same model as one process on the whole batch; they
/// differ in memory and in what crosses the wire.
enum class Sharding {
  /// Plain DDP: every rank holds parameters, gradients and optimizer state
  /// (16 bytes per parameter with fp32 AdamW); gradients are all-reduced.
  kNone,
  /// ZeRO-1 (PyTorch's ZeroRedundancyOptimizer): gradients are
  /// reduce-scattered, each rank steps and keeps the optimizer state of its
  /// 1/N of the parameters only, and the updated parameters are all-gathered.
  /// Full-size gradient buckets stay allocated between iterations.
  kOptimizer,
  /// ZeRO-2: as kOptimizer, and each gradient bucket is freed as soon as it
  /// is reduced, so between iterations a rank holds only its 1/N of the gradients.
  kGradients,
  /// ZeRO-3 (FSDP's FULL_SHARD): as kGradients, and the parameters of each
  /// unit (a module named by DistributedDataParallelOptions::shard_units)
  /// are held whole only while the unit runs, in forward and in backward;
  /// between iterations a rank holds 1/N of them. The model's forward calls
  /// each unit through ddp::in_unit. On one rank, where a shard is the whole
  /// unit, units stay whole (FSDP's NO_SHARD there).
  kFull,
};

/// "none", "optimizer", "gradients" or "full".
DDP_API std::string to_string(Sharding sharding);
/// Parses what to_string() returns (any case); UsageError naming the choices otherwise.
DDP_API Sharding parse_sharding(const std::string& name);

/// What one rank holds of the trained model, in bytes, as
/// DistributedDataParallel::memory_report() counts it.
struct DDP_API MemoryReport {
  Sharding sharding = Sharding::kNone;  ///< The mode the model runs in.
  int world_size = 1;                   ///< Ranks the state is spread over.
  std::int64_t parameter_bytes = 0;        ///< Parameters held between iterations (frozen ones too).
  std::int64_t gradient_bytes = 0;         ///< Gradient memory held between iterations.
  /// Tensors of the optimizer's state for this rank's parameters (0 before
  /// its first step; -1 for an optimizer whose state type is unknown).
  std::int64_t optimizer_state_bytes = 0;
  std::int64_t trained_elements = 0;       ///< Elements of every trained parameter.
  std::int64_t optimizer_elements = 0;     ///< Elements the optimizer steps on this rank.
  std::int64_t padding_elements = 0;       ///< Zeros added to make the shards equal (all ranks).
  /// kFull: the most memory of gathered units held at once since the first
  /// forward (which gathers every unit once, to check that each runs
  /// through ddp::in_unit).
  std::int64_t peak_gathered_bytes = 0;

  /// One line, e.g. "rank memory (gradients, 4 ranks): parameters 1.20 GiB, ...".
  std::string to_string() const;
};

}  // namespace ddp
