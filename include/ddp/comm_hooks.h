#pragma once

#include <cstddef>
#include <functional>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <ddp/communicator.h>

namespace ddp {

/// One bucket of gradients, flattened: the same layout on every rank.
struct GradBucket {
  std::size_t index;  ///< Buckets are reduced in index order on every rank.
  at::Tensor buffer;  ///< Flat gradients; must hold their average across ranks once the reduction finishes.
};

/// How DDP reduces a bucket, as PyTorch's communication hooks. Called once a
/// bucket's gradients are all ready, while backward goes on; it starts the
/// reduction and returns the function that finishes it. That function runs
/// at the end of backward, on the caller's current stream.
using CommHook = std::function<std::function<void()>(Communicator& comm, const GradBucket& bucket)>;

namespace comm_hooks {

/// All-reduce average in the gradients' own dtype (the default).
CommHook average();

/// Casts the bucket to `dtype` (bf16 or fp16), averages in it and casts back:
/// half the bytes on the wire for fp32 gradients, as PyTorch's bf16_compress_hook.
CommHook average_in(c10::ScalarType dtype);

}  // namespace comm_hooks
}  // namespace ddp
