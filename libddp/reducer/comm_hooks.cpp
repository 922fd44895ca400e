#include <ddp/comm_hooks.h>

#include <fmt/format.h>

#include <ddp/errors.h>

namespace ddp::comm_hooks {

CommHook average() {
  return [](Communicator& comm, const GradBucket& bucket) -> std::function<void()> {
    auto work = comm.all_reduce(bucket.buffer, ReduceOp::kAvg);
    return [work] { work->wait_stream(); };
  };
}

CommHook average_in(c10::ScalarType dtype) {
  if (dtype != at::kBFloat16 && dtype != at::kHalf) {
    throw UsageError(fmt::format("comm_hooks::average_in takes bf16 or fp16, got {}", c10::toString(dtype)));
  }
  return [dtype](Communicator& comm, const GradBucket& bucket) -> std::function<void()> {
    at::Tensor compressed = bucket.buffer.to(dtype);
    auto work = comm.all_reduce(compressed, ReduceOp::kAvg);
    at::Tensor buffer = bucket.buffer;
    return [work, compressed, buffer]() mutable {
      work->wait_stream();
      buffer.copy_(compressed);
    };
  };
}

}  // namespace ddp::comm_hooks
