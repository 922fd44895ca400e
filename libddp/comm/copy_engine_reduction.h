#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include <ddp/communicator.h>

#include "comm/copy_engine_kernels.h"

namespace at {
class Tensor;
}
namespace c10d {
class Store;
}

namespace ddp::detail {

/// All-reduce, reduce-scatter and all-gather between the GPUs of one node with
/// the copy engines instead of NCCL's kernels, for the gradient buckets and
/// shards that a backward pass reduces while it runs and the parameters the
/// sharded modes gather ahead of use. NCCL's kernels stay resident on SMs for
/// the whole reduction and slowed a concurrent GEMM chain by 8.6% on 2 x H100
/// (NVLink); device-to-peer copies slowed it by 0.9%
/// (benchmarks/allreduce/compute_interference.py, 2026-11-27). The SMs here
/// only run a short kernel that adds what arrived.
///
/// Each rank owns a chunk of every piece of the tensor (a reduce-scatter, then
/// an all-gather), through a staging area every rank maps from every other
/// (CUDA IPC): it pushes the peers' chunks into their staging slots, adds the
/// copies of its own chunk that arrived into its tensor and its result area,
/// and pulls the peers' results into its tensor. Ranks signal each other with
/// stream memory operations (cuStreamWriteValue32 / cuStreamWaitValue32 on
/// flags in the staging areas), which wait on the device, not on the host and
/// not on an SM. Each flag is raised by one peer and lowered by its owner once
/// taken, before anything that lets the peer raise it again; a piece leaves
/// every flag as it found it, so the same operations recorded into a CUDA
/// graph work at every replay.
///
/// reduce_scatter() is the first half alone, all_gather() the second with a
/// rank's input as its result. Every rank must issue the same collectives in
/// the same order (as with NCCL), and all of them on one stream.
class CopyEngineReduction {
 public:
  /// Sets up the staging areas of all `world_size` ranks, which must be on one
  /// node with peer access between every pair of GPUs (UsageError otherwise).
  /// Collective: every rank calls it with the same `key`.
  CopyEngineReduction(c10d::Store& store, const std::string& key, int rank, int world_size, int device_index,
                      std::chrono::milliseconds timeout);
  /// Frees the staging area if the stream drained after quiesce(); otherwise
  /// leaves it to the process's exit (a peer may still be copying).
  ~CopyEngineReduction();

  CopyEngineReduction(const CopyEngineReduction&) = delete;
  CopyEngineReduction& operator=(const CopyEngineReduction&) = delete;

  /// Whether all_reduce() and reduce_scatter() take this tensor (the
  /// all-reduced one, or reduce_scatter's input): fp32, bf16 or fp16 (any
  /// ReduceOp) and at least kMinBytes (NCCL's latency wins below). The same
  /// answer on every rank for the same call.
  static bool reduces(const at::Tensor& tensor);
  /// Whether all_gather() takes this output: any dtype (it only copies), at
  /// least kMinBytes.
  static bool gathers(const at::Tensor& output);

  /// Queues the all-reduce of `tensor` (contiguous, on this rank's GPU) in
  /// place on `stream`.
  void all_reduce(const at::Tensor& tensor, ReduceOp op, cudaStream_t stream);
  /// Communicator::reduce_scatter's contract: this rank's part of the
  /// reduction of every rank's `input` into `output` (which may be that part
  /// of `input`, or fp32 from a 16-bit input: the reduction writes it
  /// directly). Only the push and one reduction of a part: no SM work beyond
  /// it, half an all-reduce's traffic.
  void reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op, cudaStream_t stream);
  /// Communicator::all_gather's contract (in place when `input` is this
  /// rank's part of `output`): copies only, no kernel at all.
  void all_gather(const at::Tensor& output, const at::Tensor& input, cudaStream_t stream);

  /// Queues on `stream` a wait until every peer is done with this rank's
  /// staging area (the last piece's copies in and out of it). The caller
  /// drains the stream and then says whether it did: the destructor frees the
  /// area only then.
  void quiesce(cudaStream_t stream);
  void set_drained(bool drained) { drained_ = drained; }

  /// After a failure of this rank: tells the peers (failed_peers() on their
  /// side) and keeps raising this rank's flags from a helper thread until
  /// destruction, so that every wait it queued passes and the streams drain,
  /// wherever the work was queued (the communicator's stream, a graph
  /// replay). Returns at once; never throws.
  void release_after_failure() noexcept;

  /// Which peers gave up after failures of their own (release_after_failure):
  /// a one-line description to fail this rank's collectives with, or empty.
  std::string failed_peers() noexcept;

  static constexpr std::int64_t kMinBytes = 512 << 10;

 private:
  /// The flags of one rank's staging area, one per kind and peer that raises it:
  /// kPushed, the peer's copy of our chunk is in our slot; kPushConsumed, the
  /// peer has reduced what we pushed into its slot; kReduced, the peer's result
  /// is in its result area; kResultPulled, the peer has copied our result.
  enum Flag { kPushed = 0, kPushConsumed = 1, kReduced = 2, kResultPulled = 3, kFlagKinds = 4 };
  std::uint32_t* flag(int owner, Flag kind, int writer) const;
  /// Set by `writer` in `owner`'s area when it gives up (release_after_failure).
  std::uint32_t* failure_word(int owner, int writer) const;
  int flag_words() const { return (kFlagKinds + 1) * world_size_; }
  void* slot(int owner, int writer) const;
  void* result(int owner) const;

  void set_up(c10d::Store& store, const std::string& key, std::chrono::milliseconds timeout);
  void free_resources(bool staging_area_too) noexcept;
  /// Where each rank's part of one piece lies in a local buffer: address, bytes.
  using Parts = std::vector<std::pair<char*, std::int64_t>>;
  /// The other ranks, starting after `rank`.
  static std::vector<int> peer_order(int rank, int world_size);
  /// Each peer's part into its slot for us, once it has reduced our previous push.
  void push_parts(const Parts& parts, cudaStream_t stream);
  /// Our part reduced with the copies the peers pushed, into `output` (of
  /// `output_dtype`: `dtype`, or fp32); with `share`, also into our result
  /// area for the peers to pull (pull_parts), then in `dtype` alone.
  void reduce_own_part(const char* own, char* output, bool share, std::int64_t numel, ChunkDtype dtype,
                       ChunkDtype output_dtype, ReduceOp op, cudaStream_t stream);
  /// Each peer's result area into its part of `parts`.
  void pull_parts(const Parts& parts, cudaStream_t stream);

  const int rank_;
  const int world_size_;
  const int device_index_;
  const std::vector<int> peers_;  ///< peer_order(): the order every loop over the peers takes.
  std::vector<char*> bases_;  ///< Every rank's staging area, mapped into this process (ours at rank_).
  bool drained_ = false;
  cudaStream_t release_stream_ = nullptr;
  cudaStream_t poll_stream_ = nullptr;
  std::uint32_t* raised_ = nullptr;        ///< Pinned: flag_words() ones.
  std::uint32_t* peers_failed_ = nullptr;  ///< Pinned: the failure words, as last read.
  std::mutex poll_mutex_;                  ///< Guards peers_failed_ and poll_stream_.
  std::atomic<bool> releasing_{false};
  std::atomic<bool> stop_release_{false};
  std::thread release_thread_;
};

}  // namespace ddp::detail
