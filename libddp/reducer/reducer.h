#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>
#include <c10/util/Optional.h>

#include <ddp/comm_hooks.h>
#include <ddp/communicator.h>

#include "compat/torch_compat.h"

namespace ddp::detail {

class ShardedParameters;
class SparseGradients;
class Timeline;
class UnitSchedule;

/// Averages gradients across ranks while backward runs, as PyTorch's
/// reducer.cpp does: parameters are grouped into flat buckets; a post hook
/// on each parameter's AccumulateGrad node marks it ready; a bucket whose
/// parameters are all ready is reduced at once through the comm hook, in
/// bucket order (the same on every rank); when backward ends, an engine
/// callback orders the caller's stream after every reduction. No host
/// synchronisation happens in any of it, except with find_unused_parameters,
/// which needs on the host which parameters some rank used.
///
/// In the sharded modes the buckets are `sharded`'s: laid out once, padded to
/// equal shards, and reduce-scattered into its gradient shards; the full
/// gradients are then dropped, so the next backward starts from none.
class Reducer : public std::enable_shared_from_this<Reducer> {
 public:
  struct Config {
    std::size_t first_bucket_bytes = 1 << 20;
    std::size_t bucket_bytes = 25 << 20;
    bool gradient_as_bucket_view = true;
    bool find_unused_parameters = false;
    bool static_graph = false;
    /// False on one process with the averaging hook, where a gradient's
    /// average is itself: gradients stay where autograd put them, no bucket
    /// memory is allocated, and nothing is copied or launched.
    bool reduce = true;
    CommHook comm_hook;
    std::shared_ptr<Timeline> timeline;  // null: not recorded
    /// Sharded modes: the parameters' buffers and gradient shards, whose
    /// bucket plan the reducer takes and never rebuilds (the optimizer holds
    /// fragments of that layout).
    std::shared_ptr<ShardedParameters> sharded;
    /// kGradients: a bucket's memory is allocated when its gradients are all
    /// ready and released once its reduction is launched.
    bool free_reduced_buckets = false;
    /// kFull: told of each accumulated gradient and of each backward's end,
    /// to free the units' gathered parameters. With find_unused_parameters
    /// every rank must then leave the same parameters unused, which is
    /// checked each iteration: the units' gathers, issued from autograd's
    /// hooks, and the reductions of buckets with unused parameters, issued
    /// at the end, must come in one order on every rank.
    std::shared_ptr<UnitSchedule> units;
    /// Parameters with sparse gradients, kept out of the buckets: averaged
    /// at the end of each reduced backward.
    std::shared_ptr<SparseGradients> sparse;
  };

  /// `plan`: the first buckets, indices into `parameters` (initial_buckets()).
  Reducer(std::vector<at::Tensor> parameters, std::vector<std::string> names,
          const std::vector<std::vector<std::size_t>>& plan, Communicator& comm, Config config);
  ~Reducer();

  /// Registers the autograd hooks; call once, right after construction.
  void install_hooks();
  /// Before each forward: rebuilds the buckets in ready order once, after the first reduced iteration.
  void prepare_for_forward();
  /// After a forward whose backward must reduce: arms the hooks; with
  /// find_unused_parameters, finds the parameters `outputs` do not depend on.
  void prepare_for_backward(const std::vector<at::Tensor>& outputs);
  /// A rank out of batches (ddp::Join) meets the others' backward: every
  /// bucket is reduced as zeros, through the comm hook, and so are the
  /// used-parameter flags and sparse gradients. Its own gradients are dropped.
  void shadow_backward();
  /// shadow_backward() a bucket at a time, for a rank that repeats the
  /// reductions in the order of its own last backward, between gathers
  /// (Sharding::kFull): begin, then each bucket in order, then finalize.
  void begin_shadow_backward();
  void shadow_bucket(std::size_t bucket);
  /// After backward: orders the caller's stream after every reduction and
  /// gives the parameters (or their shards) the averaged gradients.
  void finalize_backward();
  /// How many ranks the reduced gradients average over: the comm hook's
  /// average over all ranks is rescaled to these (ddp::Join without
  /// divide_by_initial_world_size). Default: every rank.
  void set_averaging_ranks(int ranks);

  /// Per parameter, whether `outputs` depend on it (a walk of the autograd graph).
  std::vector<std::uint8_t> used_by(const std::vector<at::Tensor>& outputs) const;

  void set_sync(bool sync);
  bool sync() const;
  /// A forward recorded gradients that the coming backward will reduce, and that backward has not run.
  bool backward_due() const;
  std::vector<std::size_t> bucket_bytes() const;
  /// Bytes of the bucket buffers allocated now, but for those that are a
  /// sharded mode's gradient shards themselves (one rank).
  std::int64_t allocated_bucket_bytes() const;

 private:
  struct Bucket {
    std::vector<std::size_t> parameters;  // indices into parameters_
    std::size_t bytes = 0;                // of their gradients
    std::int64_t numel = 0;               // of their gradients
    std::int64_t padded_numel = 0;        // of the buffer: the gradients, then zeros up to equal shards
    at::Tensor buffer;                    // flat gradients of those parameters (none without reduce)
    std::vector<at::Tensor> views;        // one per parameter, shaped and strided like it (none while unallocated)
    at::Tensor shard;                     // sharded modes: this rank's part of the averaged buffer
    std::size_t pending = 0;              // parameters not ready yet in this backward
    std::vector<std::size_t> to_copy;     // slots whose gradient lives outside the bucket
    std::function<void()> finish;         // what the comm hook left to do
    /// With a timeline: the communicator the hook was given, kept until its
    /// finish has run, since a hook's finish may hold and use it.
    std::unique_ptr<Communicator> observer;
  };

  void build_buckets(const std::vector<std::vector<std::size_t>>& plan);
  /// Gives `bucket` its buffer and the views of it: zeros, or with `zeroed`
  /// false new memory left as it is. Returns whether the buffer is such
  /// uninitialised memory (a rank's own shard is reused as it is).
  bool allocate(Bucket& bucket, bool zeroed = true) const;
  /// Zeroes what the copies of the gradients in `sorted_slots` will not write: the padding and every other slot.
  static void zero_all_but(Bucket& bucket, const std::vector<std::size_t>& sorted_slots);
  /// kGradients on several ranks: buckets exist only between their gradients' arrival and their reduction.
  bool frees_buckets() const;
  void hook(std::size_t index, compat::GradAccumulatorPtr accumulator);
  /// Re-hooks parameters whose gradient accumulator autograd replaced.
  void follow_replaced_accumulators();
  /// The caller's current stream on the communicator's device.
  c10::Stream current_stream() const;
  /// An AccumulateGrad node runs on the stream that was current when it was
  /// made, and the reducer keeps its nodes alive. A forward on another stream
  /// (a CapturedStep's side stream) gets new nodes, made on it: with the old
  /// ones backward would make that stream wait on the old one, which a CUDA
  /// graph capture forbids (PyTorch asks Python users to build DDP on the
  /// side stream instead).
  void follow_current_stream();
  void on_gradient_ready(std::size_t index);
  void mark_ready(std::size_t index, bool used);
  void gather_into_bucket(Bucket& bucket);
  void launch_ready_buckets();
  /// Resets the per-backward state, for a backward or its shadow.
  void start_backward();
  /// Per parameter, whether any rank used it in this backward (a host sync;
  /// under static_graph only the first time, so that a step can be recorded).
  std::vector<std::uint8_t> globally_used();
  void adopt_globally_used_gradients(const std::vector<std::uint8_t>& used);
  /// kFull: UsageError on every rank if the ranks left different parameters unused.
  void check_same_unused_on_all_ranks() const;
  std::vector<std::size_t> find_unused(const std::vector<at::Tensor>& outputs) const;
  std::string names_of(const std::vector<std::size_t>& indices) const;

  std::vector<at::Tensor> parameters_;
  std::vector<std::string> names_;
  Communicator& comm_;
  Config config_;

  std::vector<Bucket> buckets_;
  std::vector<std::pair<std::size_t, std::size_t>> location_;  // parameter -> (bucket, slot)
  std::vector<compat::GradAccumulatorPtr> accumulators_;  // kept alive: autograd holds them weakly
  std::vector<std::uintptr_t> hook_keys_;

  mutable std::mutex mutex_;
  bool sync_ = true;
  bool armed_ = false;            // the coming backward reduces
  bool finalize_queued_ = false;  // the engine callback for this backward is queued
  // The stream the forward ran on. The engine runs the end-of-backward
  // callback on its own thread, whose current stream may be another one (the
  // legacy default stream): the callback's copies and stream waits must go
  // where the caller's work goes, or a step recorded into a CUDA graph on a
  // side stream could not be captured.
  // c10::optional: what OptionalStreamGuard takes in LibTorch 1.13.
  c10::optional<c10::Stream> caller_stream_;
  // Where accumulators_ run: the stream current when they were made.
  c10::Stream accumulator_stream_{c10::Stream::DEFAULT, c10::Device(c10::kCPU)};
  bool unused_marked_ = false;
  std::size_t next_bucket_ = 0;   // buckets launch strictly in order
  std::vector<std::uint8_t> ready_;
  std::vector<std::uint8_t> used_;
  /// Parameters that got a gradient in a backward without synchronisation
  /// (no_sync) since the last synchronised one: used, for find_unused_parameters.
  std::vector<std::uint8_t> used_without_sync_;
  std::vector<std::size_t> unused_;
  std::optional<std::vector<std::size_t>> static_unused_;
  std::optional<std::vector<std::uint8_t>> static_globally_used_;
  int averaging_ranks_ = 0;               // 0: every rank
  std::vector<std::size_t> ready_order_;  // of the first reduced backward
  std::size_t reduced_iterations_ = 0;
  bool rebuilt_ = false;
};

}  // namespace ddp::detail
