#pragma once

// Embeddings with sparse gradients under DDP against one process that saw
// every rank's batch: the Gloo (CPU) and NCCL (GPU) suites run the same check.

#include <memory>

#include <ddp/ddp.h>

namespace ddp::testing {

/// Trains 3 SGD steps of a model with two sparse embeddings under DDP on
/// `pg`'s device and in one process on both ranks' batches, comparing
/// gradients and parameters; throws std::runtime_error naming the first
/// difference. `rare_on_rank0_only`: only rank 0's forward uses one of the
/// embeddings (find_unused_parameters). `accumulate`: each step first runs a
/// micro-batch under no_sync. Two ranks.
void check_sparse_matches_one_process(const std::shared_ptr<ProcessGroup>& pg, bool rare_on_rank0_only,
                                      bool accumulate);

/// The model with sparse embeddings, under a sharding mode: UsageError naming the parameter.
void check_sharding_refuses_sparse(const std::shared_ptr<ProcessGroup>& pg);

}  // namespace ddp::testing
