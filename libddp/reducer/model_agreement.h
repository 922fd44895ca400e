#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <ddp/communicator.h>

namespace ddp::detail {

/// Throws UsageError on every rank unless all ranks have the same tensors
/// (count, order, names, shapes, dtypes); `names` say what each is
/// ("parameter 'fc.weight'", "buffer 'bn.running_mean'"), and the message
/// names the first mismatch of each differing rank. Collective.
void check_same_model_on_all_ranks(Communicator& comm, const std::vector<std::string>& names,
                                   const std::vector<at::Tensor>& tensors);

/// Copies the tensors of rank `root` into the same tensors of every rank, one
/// flat broadcast per dtype. Collective; returns when the copies are queued
/// on the current stream.
void broadcast_coalesced(Communicator& comm, const std::vector<at::Tensor>& tensors, int root);

}  // namespace ddp::detail
