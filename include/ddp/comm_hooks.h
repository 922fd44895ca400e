#pragma once

#include <cstddef>
#include <functional>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <ddp/export.h>
#include <ddp/communicator.h>

namespace ddp {

/// One bucket of gradients, flattened: the same layout on every rank.
struct GradBucket {
  std::size_t index;  ///< Buckets are reduced in index order on every rank.
  /// Flat gradients. Without sharding it must hold their average across
  /// ranks once the reduction finishes.
  at::Tensor buffer;
  /// Sharded modes only (undefined otherwise): buffer holds world_size equal
  /// parts, and this rank's part of the average must end up here
  /// (Communicator::reduce_scatter); buffer itself need not change. Its
  /// dtype may be wider than the buffer's (with a narrower param_dtype the
  /// sharded modes keep fp32 gradient shards of bf16 gradients).
  at::Tensor shard;
};

/// How DDP reduces a bucket, as PyTorch's communication hooks. Called once a
/// bucket's gradients are all ready, while backward goes on; it starts the
/// reduction and returns the function that finishes it. That function runs
/// at the end of backward, on the caller's current stream.
using CommHook = std::function<std::function<void()>(Communicator& comm, const GradBucket& bucket)>;

namespace comm_hooks {

/// Average in the gradients' own dtype (the default): an all-reduce, or a
/// reduce-scatter in the sharded modes.
DDP_API CommHook average();

/// Casts the bucket to `dtype` (bf16, fp16 or fp32), averages in it and
/// casts back: half the bytes on the wire for fp32 gradients in bf16, as
/// PyTorch's bf16_compress_hook; or bf16 gradients averaged in fp32 (the
/// sharded modes with param_dtype bf16). FSDP calls it reduce_dtype.
DDP_API CommHook average_in(c10::ScalarType dtype);

}  // namespace comm_hooks
}  // namespace ddp
