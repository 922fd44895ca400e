#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>
#include <c10/util/Optional.h>

#include <ddp/communicator.h>

#include "sharding/shard_layout.h"

namespace ddp::detail {

/// A collective of a sharded bucket, as a rank issued it: the all-gather of
/// a transient bucket, or the reduce-scatter of a bucket's gradients.
struct ShardedCollective {
  enum Kind { kGather, kReduce } kind;
  std::size_t bucket;
};

/// The parameters of the sharded modes. Each bucket's parameters become views
/// of one flat, padded buffer, so that an all-gather fills them all at once.
/// This rank's optimizer steps only its shard of each buffer, through one
/// fragment per parameter: a flat alias of the part of the parameter in the
/// shard, whose gradient aliases the bucket's reduced gradient shard. For an
/// elementwise optimizer (SGD, Adam, AdamW and their fused kernels) stepping
/// the fragments is stepping the parameters.
///
/// A resident bucket (ZeRO-1 and 2, and kFull's parameters outside units)
/// keeps its whole buffer, and the shard is its own part of it. A transient
/// bucket (a kFull unit) keeps only the shard, as a tensor of its own; its
/// buffer holds memory only from start_gather() to release(), while the
/// parameters, views of it, keep their shapes throughout. Releasing swaps
/// the storage's memory out instead of re-pointing the parameters, so the
/// tensors autograd saved in forward see the memory of the next gather.
///
/// A unit's bucket, transient or resident, may be gathered in a narrower
/// dtype than its shard (FSDP's param_dtype; DeepSpeed's bf16 mode for ZeRO-1
/// and 2): the parameters, views of the buffer, then take that dtype and so
/// do their gradients, while the shard the optimizer steps (then a master of
/// its own, also in a resident bucket) and the gradient shard keep the
/// parameters' own (fp32 masters).
class ShardedParameters {
 public:
  /// `plan`: buckets of indices into `parameters`, the reducer's. Copies the
  /// parameters' values into the buffers and points the parameters there.
  /// `gradient_shards`: whether the reducer reduces into gradient shards; if
  /// not (one rank, nothing to average), the fragments' gradients alias the
  /// parameters' own, as plain DDP leaves them on one rank.
  /// `unit_of_bucket`: per bucket, the shard unit whose parameters it holds,
  /// or -1 (empty: no units). `transient_units`: whether unit buckets are
  /// transient (kFull); they start gathered. `gathered_dtype`: the dtype
  /// unit buckets are gathered in (Undefined: the parameters' own).
  ShardedParameters(std::vector<at::Tensor> parameters, const std::vector<std::vector<std::size_t>>& plan,
                    Communicator& comm, bool gradient_shards, const std::vector<int>& unit_of_bucket = {},
                    bool transient_units = false, at::ScalarType gathered_dtype = at::ScalarType::Undefined);

  const ShardLayout& layout(std::size_t bucket) const { return buckets_[bucket].layout; }
  /// The bucket's parameters (indices into the parameters given), in layout order.
  const std::vector<std::size_t>& bucket_parameters(std::size_t bucket) const { return buckets_[bucket].parameters; }
  /// This rank's part of the bucket's averaged gradient (kept between
  /// iterations); undefined without gradient shards.
  const at::Tensor& gradient_shard(std::size_t bucket) const { return buckets_[bucket].gradient_shard; }
  bool has_gradient_shards() const { return gradient_shards_; }

  /// After a synchronised backward: each fragment's gradient is its part of
  /// the gradient shard (or of the parameter's gradient), but a parameter no
  /// rank used (`globally_used`, by parameter index; null: all were) is left
  /// as one process leaves it: without a gradient, or with zeros where
  /// zero_grad() left zeros. The next gather() makes the parameters whole.
  void attach_gradients(const std::vector<std::uint8_t>* globally_used);

  /// Before a forward: if an optimizer may have stepped the shards since the
  /// last synchronised backward, casts the masters of resident buckets in a
  /// narrower dtype into their parts, and all-gathers every resident buffer (the
  /// current stream waits for the gathers on the device; the host does not).
  /// With `defer_units`, a unit's resident bucket is only started (its cast
  /// too, on a side stream on a GPU): the unit's entry waits for it
  /// (finish_gather), so that the gathers of later layers overlap the
  /// forward of earlier ones. Without gradient shards it drops the
  /// parameters' gradients then instead: the step has consumed
  /// them, and the next backward must not add to them. Transient buckets
  /// are left to start_gather(). UsageError if a parameter no longer views
  /// its buffer (Module::load or Module::to replaced its storage), naming
  /// the loaders that write into the shards.
  void gather(bool defer_units = false);
  /// gather() for the caller (DistributedDataParallel::gather_parameters),
  /// leaving a pending gather pending: called between backward and the
  /// optimizer's step, the step still changes the shards, and the next
  /// forward must gather them again. Collective.
  void gather_for_caller();

  std::size_t bucket_count() const { return buckets_.size(); }
  bool transient(std::size_t bucket) const { return buckets_[bucket].transient; }
  /// A transient bucket: allocates its buffer and starts all-gathering the
  /// shards into it on the communicator's stream; nothing if it has memory.
  /// Collective.
  void start_gather(std::size_t bucket);
  /// Orders the current stream after the bucket's gather (a transient one's
  /// is started now if it was not), so kernels queued next see the parameters.
  void finish_gather(std::size_t bucket);
  /// Orders the current stream after the bucket's gather in flight, if any,
  /// starting none: a prefetch or a deferred gather whose unit did not run.
  void settle(std::size_t bucket);
  /// settle() for every bucket. A deferred unit's cast reads its master on a
  /// side stream until its gather is settled: settle every bucket before
  /// writing into the fragments or masters (a loader; the optimizer steps
  /// only after the forward has settled them).
  void settle_all();
  /// A transient bucket: gives its buffer's memory back (the allocator
  /// reuses it once the kernels queued so far are done with it). Nothing
  /// for a resident one.
  void release(std::size_t bucket);
  bool has_memory(std::size_t bucket) const { return buckets_[bucket].has_memory; }

  /// The fragments of `module_parameters` (trained parameters of the module),
  /// in their order; parameters with no part on this rank are left out, and
  /// tensors that require no gradient (frozen parameters) are passed through.
  /// UsageError for any other tensor that is not one of them.
  std::vector<at::Tensor> local_parameters(const std::vector<at::Tensor>& module_parameters) const;
  /// Every fragment, in parameter order.
  std::vector<at::Tensor> local_parameters() const { return local_parameters(parameters_); }
  /// The fragment of parameter `index` on this rank; undefined if it has no part here.
  at::Tensor fragment_of(std::size_t index) const;
  /// The dtype parameter `index` is trained (stepped and saved) in: its own
  /// before sharding, also when it is gathered in another.
  at::ScalarType trained_dtype(std::size_t index) const { return trained_dtypes_[index]; }
  /// Where that fragment begins in the parameter, in elements of its flat
  /// layout (flat_layout_strides); -1 if it has no part here.
  std::int64_t fragment_begin(std::size_t index) const;
  /// After values were written into the fragments (a sharded checkpoint
  /// loaded, after settle_all()): the next gather() all-gathers every
  /// buffer again, and gathered transient buckets are released, to be
  /// gathered from their shards.
  void shards_written();

  /// Assembles a quantity held per fragment (an optimizer moment) for the
  /// whole model, one bucket at a time, so that no device holds more than one
  /// bucket of it: `part(index)` gives the values of parameter `index`'s
  /// fragment on this rank (undefined: zeros), and `whole(index, values)`
  /// receives every parameter's values, shaped and laid out as the parameter,
  /// on every rank. Collective.
  void gather_whole(const std::function<at::Tensor(std::size_t index)>& part,
                    const std::function<void(std::size_t index, const at::Tensor& values)>& whole);
  /// The part of `values` (shaped as parameter `index`, in any layout) that
  /// lies in this rank's fragment of it, as a flat tensor on its device.
  at::Tensor part_of(std::size_t index, const at::Tensor& values) const;

  /// Sharding::kFull: a forward of kind `kind` (the caller's numbering)
  /// begins; the transient gathers and reductions from here until the next
  /// forward or stop_recording() are kept as that kind's, for a rank out of
  /// batches under a ddp::Join to repeat.
  void begin_recording(int kind);
  void stop_recording() { recording_ = nullptr; }
  /// The collectives of the last forward of `kind` (and its backward); null if none ran.
  const std::vector<ShardedCollective>* recorded(int kind) const;
  /// The reducer launched the reduction of `bucket`.
  void note_reduction(std::size_t bucket) {
    if (recording_ != nullptr) recording_->push_back({ShardedCollective::kReduce, bucket});
  }

  /// Parameter memory between iterations: resident buffers and masters.
  std::int64_t buffer_bytes() const;
  /// The most transient buffer memory held at once since restart_peak().
  std::int64_t peak_gathered_bytes() const { return peak_gathered_bytes_; }
  void restart_peak() { peak_gathered_bytes_ = gathered_bytes_; }
  std::int64_t gradient_shard_bytes() const;  ///< The gradient shards (0 without).
  /// Without gradient shards: the fragments' gradients converted to the
  /// masters' dtype from a narrower gathered one (kept beside the module's own).
  std::int64_t converted_gradient_bytes() const;
  std::int64_t trained_elements() const;
  std::int64_t local_elements() const;        ///< In this rank's fragments.
  std::int64_t padding_elements() const;

 private:
  struct Fragment {
    std::size_t parameter;  ///< Index into parameters_.
    std::int64_t begin;     ///< First element in the parameter (in its memory order).
    at::Tensor value;       ///< Aliases the parameter buffer.
    at::Tensor gradient;    ///< Aliases the gradient shard.
  };
  struct Bucket {
    std::vector<std::size_t> parameters;  ///< Indices into parameters_, in layout order.
    ShardLayout layout;
    at::Tensor buffer;          ///< padded_numel elements; the parameters are views of it.
    at::Tensor gradient_shard;  ///< shard_numel elements.
    bool transient = false;
    bool in_unit = false;       ///< Holds a shard unit's parameters.
    at::Tensor master;          ///< Transient or narrowed: this rank's shard_numel elements, kept.
    bool has_memory = true;     ///< Transient: the buffer is allocated (gathered or gathering).
    std::shared_ptr<Work> gathering;  ///< The gather in flight, if one is.
  };

  /// Points parameter `slot` of `bucket` at its place in the buffer, first
  /// copying its value there (cast to the buffer's dtype).
  void adopt(Bucket& bucket, std::size_t slot);
  bool adopted(const Bucket& bucket, std::size_t slot) const;
  /// A resident bucket gathered narrower than its master: casts the master
  /// into this rank's part of the buffer, on the current stream.
  void cast_master(Bucket& bucket);
  /// On a CUDA device, this object's side stream, ordered after the current
  /// stream's work so far, for casts and gathers the forward waits for
  /// later; none elsewhere.
  c10::optional<c10::Stream> side_stream();
  /// A flat alias of parameter `index`'s gradient, in the parameter's memory
  /// order; undefined if it has none.
  at::Tensor parameter_gradient(std::size_t index) const;

  std::vector<at::Tensor> parameters_;
  std::vector<at::ScalarType> trained_dtypes_;  // per parameter, before any gathered dtype
  Communicator& comm_;
  std::vector<Bucket> buckets_;
  std::vector<Fragment> fragments_;                                         // in parameter order
  std::unordered_map<const c10::TensorImpl*, std::size_t> fragment_of_;     // parameter -> index into fragments_
  std::unordered_map<const c10::TensorImpl*, std::size_t> index_of_;       // parameter -> index into parameters_
  const bool gradient_shards_;
  bool gather_pending_ = false;
  std::int64_t gathered_bytes_ = 0;       // transient buffers with memory now
  std::int64_t peak_gathered_bytes_ = 0;
  std::map<int, std::vector<ShardedCollective>> recorded_;  // by kind of forward
  std::vector<ShardedCollective>* recording_ = nullptr;     // into recorded_, or null
  c10::optional<c10::Stream> side_stream_;                  // taken at the first deferred cast
};

}  // namespace ddp::detail
