#include <ddp/comm_hooks.h>

#include <ATen/ops/empty.h>
#include <fmt/format.h>

#include <ddp/errors.h>

namespace ddp::comm_hooks {

CommHook average() {
  return [](Communicator& comm, const GradBucket& bucket) -> std::function<void()> {
    auto work = bucket.shard.defined() ? comm.reduce_scatter(bucket.shard, bucket.buffer, ReduceOp::kAvg)
                                       : comm.all_reduce(bucket.buffer, ReduceOp::kAvg);
    return [work] { work->wait_stream(); };
  };
}

CommHook average_in(c10::ScalarType dtype) {
  if (dtype != at::kBFloat16 && dtype != at::kHalf) {
    throw UsageError(fmt::format("comm_hooks::average_in takes bf16 or fp16, got {}", c10::toString(dtype)));
  }
  return [dtype](Communicator& comm, const GradBucket& bucket) -> std::function<void()> {
    at::Tensor compressed = bucket.buffer.to(dtype);
    // Where the average lands: the whole buffer, or this rank's shard.
    at::Tensor result = bucket.shard.defined() ? bucket.shard : bucket.buffer;
    at::Tensor reduced = compressed;
    std::shared_ptr<Work> work;
    if (bucket.shard.defined()) {
      reduced = at::empty({bucket.shard.numel()}, compressed.options());
      work = comm.reduce_scatter(reduced, compressed, ReduceOp::kAvg);
    } else {
      work = comm.all_reduce(compressed, ReduceOp::kAvg);
    }
    return [work, reduced, result]() mutable {
      work->wait_stream();
      result.copy_(reduced);
    };
  };
}

}  // namespace ddp::comm_hooks
