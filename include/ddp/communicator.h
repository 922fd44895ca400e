#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <c10/core/Device.h>

#include <ddp/export.h>

namespace at {
class Tensor;
}

namespace ddp {

/// Communication library that carries the collectives.
enum class Backend { kNccl, kGloo };

/// "nccl" or "gloo".
DDP_API std::string to_string(Backend backend);
/// Parses "nccl" or "gloo" (any case); UsageError for anything else.
DDP_API Backend parse_backend(const std::string& name);
/// Whether this build of libddp has the backend (NCCL needs LibTorch with CUDA,
/// Gloo needs Gloo's headers at build time).
DDP_API bool is_available(Backend backend);

/// Reduction of all_reduce. kAvg is the sum divided by world_size().
enum class ReduceOp { kSum, kAvg, kMax };

/// "sum", "avg" or "max".
DDP_API std::string to_string(ReduceOp op);

/// Handle to a collective in flight.
class DDP_API Work {
 public:
  virtual ~Work() = default;

  /// Blocks the calling thread until the collective has finished. Throws
  /// CollectiveError if it failed or did not finish within the timeout.
  virtual void wait() = 0;

  /// Orders the caller's current CUDA stream after the collective without
  /// blocking the host, so later kernels see its result. On CPU backends the
  /// same as wait().
  virtual void wait_stream() = 0;

  /// True once the collective finished (successfully or not); never blocks.
  virtual bool is_completed() = 0;
};

/// Collectives over all ranks of a job.
///
/// Tensors must be contiguous and live on device(); every rank must call the
/// same collectives in the same order with tensors of the same dtype and size.
/// Calls return at once and the collective runs in the background (NCCL: on
/// the communicator's own stream, ordered after the work already queued on the
/// caller's current stream).
///
/// Every collective has a deadline of timeout(). When one fails or times out,
/// the rank that notices throws a CollectiveError naming the operation and how
/// far every other rank got; the communicator is unusable afterwards.
class DDP_API Communicator {
 public:
  virtual ~Communicator() = default;

  /// This process's rank, 0 <= rank() < world_size().
  virtual int rank() const = 0;
  /// Number of ranks in the job.
  virtual int world_size() const = 0;
  /// The backend carrying the collectives.
  virtual Backend backend() const = 0;
  /// Device the tensors must live on: cuda:LOCAL_RANK for NCCL, cpu for Gloo.
  virtual c10::Device device() const = 0;
  /// Deadline of every collective (InitOptions::timeout).
  virtual std::chrono::milliseconds timeout() const = 0;

  /// Reduces `tensor` in place across ranks; every rank gets the result.
  /// kAvg needs a floating-point dtype.
  virtual std::shared_ptr<Work> all_reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::kSum) = 0;
  /// Copies `tensor` of rank `root` into `tensor` of every other rank.
  virtual std::shared_ptr<Work> broadcast(const at::Tensor& tensor, int root = 0) = 0;
  /// Concatenates every rank's `input` into `output`, which holds
  /// world_size() * input.numel() elements of input's dtype, in rank order.
  virtual std::shared_ptr<Work> all_gather(const at::Tensor& output, const at::Tensor& input) = 0;
  /// Reduces every rank's `input`, which holds world_size() * output.numel()
  /// elements, and leaves in `output` this rank's part of the result: the
  /// elements [rank() * n, (rank() + 1) * n) with n = output.numel(). `output`
  /// may be that part of `input` itself (in place), and of `input`'s dtype or,
  /// for a bf16 or fp16 `input`, fp32 (16-bit gradients reduced straight into
  /// an fp32 shard). kAvg needs a floating-point dtype.
  virtual std::shared_ptr<Work> reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                                               ReduceOp op = ReduceOp::kSum) = 0;
  /// Returns once every rank has called barrier(); throws on timeout.
  virtual void barrier() = 0;
};

}  // namespace ddp
