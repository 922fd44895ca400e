#pragma once

// ddp::SyncBatchNorm against one process's torch::nn::BatchNorm2d on the
// ranks' batches laid end to end. The Gloo (CPU) and NCCL (GPU) suites run
// the same checks.

#include <memory>
#include <vector>

#include <ddp/ddp.h>

namespace ddp::testing {

/// One layer, two training steps then evaluation, ranks with `batches[rank]`
/// images each (0 allowed): outputs, input gradients, the weight and bias
/// gradients summed over the ranks, and the running statistics all equal
/// one process's. Throws std::runtime_error naming the first difference.
void check_sync_batch_norm_matches_one_process(const std::shared_ptr<ProcessGroup>& pg,
                                               const std::vector<int>& batches);

/// A convolution, SyncBatchNorm and a linear head inside
/// DistributedDataParallel, three SGD steps on equal per-rank batches:
/// parameters and buffers equal one process with BatchNorm2d on the whole batch.
void check_sync_batch_norm_under_ddp_matches_one_process(const std::shared_ptr<ProcessGroup>& pg);

}  // namespace ddp::testing
