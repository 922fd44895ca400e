#pragma once

// ddp::SyncBatchNorm against one process's torch::nn::BatchNorm2d on the
// ranks' batches laid end to end. The Gloo (CPU) and NCCL (GPU) suites run
// the same checks.

#include <memory>
#include <vector>

#include <torch/types.h>

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

/// ddp::fused_batch_norm with the group (BatchNorm over every rank's batch,
/// the residual add and ReLU), then ddp::SyncBatchNorm, on [n, 8, 4, 4]
/// inputs in `layout` and `dtype` on the group's device, ranks with
/// `batches[rank]` images (0 allowed: that rank's empty input has the NCHW
/// strides an empty convolution output has): outputs (in `layout`), the input's and
/// residual's gradients, the weight's and bias's summed over the ranks and
/// the running statistics equal one process's ATen ops in fp32 on the batches
/// laid end to end, to `tolerance` of the largest value. `fused_kernels`:
/// whether libddp's kernels must have run it (on CUDA), or ATen's ops (the CPU).
void check_fused_sync_batch_norm_matches_one_process(const std::shared_ptr<ProcessGroup>& pg,
                                                     const std::vector<int>& batches, torch::ScalarType dtype,
                                                     double tolerance, bool fused_kernels,
                                                     torch::MemoryFormat layout = torch::MemoryFormat::ChannelsLast);

}  // namespace ddp::testing
