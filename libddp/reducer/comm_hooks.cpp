#include <ddp/comm_hooks.h>

#include <ATen/ops/empty.h>
#include <fmt/format.h>

#include <ddp/errors.h>

namespace ddp::comm_hooks {

namespace {

// Averages `wire` (the bucket's gradients, or a cast of them) across ranks and
// lands the result where the bucket wants it: the whole buffer, or this
// rank's shard, casting back when the dtypes differ.
std::function<void()> average_over_wire(Communicator& comm, const GradBucket& bucket, const at::Tensor& wire) {
  const at::Tensor result = bucket.shard.defined() ? bucket.shard : bucket.buffer;
  at::Tensor reduced = wire;
  std::shared_ptr<Work> work;
  if (bucket.shard.defined()) {
    // A 16-bit wire reduce-scatters straight into an fp32 shard (bf16 units'
    // gradients, or average_in(bf16) of fp32 ones): no second pass over it.
    const bool into_shard =
        wire.scalar_type() == result.scalar_type() || (result.scalar_type() == at::kFloat && wire.element_size() == 2);
    reduced = into_shard ? result : at::empty({result.numel()}, wire.options());
    work = comm.reduce_scatter(reduced, wire, ReduceOp::kAvg);
  } else {
    work = comm.all_reduce(wire, ReduceOp::kAvg);
  }
  if (reduced.is_same(result)) return [work] { work->wait_stream(); };
  return [work, reduced, result]() mutable {
    work->wait_stream();
    result.copy_(reduced);
  };
}

}  // namespace

CommHook average() {
  return [](Communicator& comm, const GradBucket& bucket) { return average_over_wire(comm, bucket, bucket.buffer); };
}

CommHook average_in(c10::ScalarType dtype) {
  if (dtype != at::kBFloat16 && dtype != at::kHalf && dtype != at::kFloat) {
    throw UsageError(fmt::format("comm_hooks::average_in takes bf16, fp16 or fp32, got {}", c10::toString(dtype)));
  }
  return [dtype](Communicator& comm, const GradBucket& bucket) {
    return average_over_wire(comm, bucket, bucket.buffer.to(dtype));
  };
}

}  // namespace ddp::comm_hooks
