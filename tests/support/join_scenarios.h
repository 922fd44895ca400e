#pragma once

// ddp::Join against one process: ranks with different numbers of batches
// train as one process that saw, at each step, the batches of the ranks that
// still had one. The Gloo (CPU) and NCCL (GPU) suites run the same check.

#include <memory>
#include <vector>

#include <ddp/ddp.h>

namespace ddp::testing {

struct JoinScenario {
  std::vector<int> batches;  ///< Per rank; the world size is their count.
  bool divide_by_initial_world_size = true;
  int micro_batches = 1;     ///< All but the last under no_sync().
  bool side_branch = false;  ///< A layer some ranks skip at some steps (find_unused_parameters).
  bool batch_norm = false;   ///< Buffers broadcast before each training forward.
  bool grad_scaler = false;  ///< The last rank's second batch holds an inf: every active rank skips that step.
  /// Steps every rank trains after done(), with JoinOptions::optimizer given
  /// (momentum SGD: a stale momentum buffer would drift apart).
  int steps_after_join = 0;
  /// With a sharding mode the layers "first" and "second" are shard units,
  /// and the joined ranks step their shards through JoinOptions::optimizer.
  Sharding sharding = Sharding::kNone;
  /// Every rank evaluates (no gradients) before each training step: under
  /// kFull, gathers a joined rank must repeat between those of training.
  bool evaluate_each_step = false;
};

/// Trains the scenario under ddp::Join on `pg` (a rank per entry of
/// `batches`) and checks, after done(), the parameters against one process,
/// and the buffers and the GradScaler's scale against the other ranks.
/// Throws std::runtime_error naming the first difference.
void check_join_matches_one_process(const std::shared_ptr<ProcessGroup>& pg, const JoinScenario& s);

/// A rank that leaves without done(): ranks 0 and 1 of a 2-rank job with 4 and 1
/// batches; rank 1 exits its process, rank 0 must get a CollectiveError naming it.
void check_exit_without_join_is_named(const std::shared_ptr<ProcessGroup>& pg);

}  // namespace ddp::testing
