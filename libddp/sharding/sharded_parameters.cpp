#include "sharding/sharded_parameters.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/GradMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <ddp/errors.h>

#include "reducer/row_major.h"

namespace ddp::detail {

ShardedParameters::ShardedParameters(std::vector<at::Tensor> parameters,
                                     const std::vector<std::vector<std::size_t>>& plan, Communicator& comm,
                                     bool gradient_shards, const std::vector<int>& unit_of_bucket, bool transient_units,
                                     at::ScalarType gathered_dtype)
    : parameters_(std::move(parameters)), comm_(comm), gradient_shards_(gradient_shards) {
  c10::NoGradGuard no_grad;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    index_of_[parameters_[i].unsafeGetTensorImpl()] = i;
    trained_dtypes_.push_back(parameters_[i].scalar_type());
  }
  std::vector<Fragment> fragments;
  for (const auto& indices : plan) {
    Bucket bucket;
    bucket.parameters = indices;
    bucket.in_unit = !unit_of_bucket.empty() && unit_of_bucket[buckets_.size()] >= 0;
    bucket.transient = bucket.in_unit && transient_units;
    std::vector<std::int64_t> numels;
    for (std::size_t index : indices) numels.push_back(parameters_[index].numel());
    bucket.layout = layout_shards(numels, comm_.world_size());
    const at::Tensor& first = parameters_[indices.front()];
    bucket.buffer = at::zeros({bucket.layout.padded_numel}, first.options());
    if (gradient_shards_) bucket.gradient_shard = at::zeros({bucket.layout.shard_numel}, first.options());
    for (std::size_t slot = 0; slot < indices.size(); ++slot) adopt(bucket, slot);
    const std::int64_t shard_begin = comm_.rank() * bucket.layout.shard_numel;
    const bool narrowed =
        bucket.in_unit && gathered_dtype != at::ScalarType::Undefined && gathered_dtype != bucket.buffer.scalar_type();
    if (bucket.transient || narrowed) {
      bucket.master = bucket.buffer.narrow(0, shard_begin, bucket.layout.shard_numel).clone();
    }
    if (narrowed) {
      // The parameters take the gathered dtype; the master keeps their values whole.
      bucket.buffer = bucket.buffer.to(gathered_dtype);
      for (std::size_t slot = 0; slot < indices.size(); ++slot) adopt(bucket, slot);
    }
    // The optimizer's view of the shard: the kept master if there is one,
    // else in place in the resident buffer.
    const at::Tensor& shard_home = bucket.master.defined() ? bucket.master : bucket.buffer;
    const std::int64_t home_begin = bucket.master.defined() ? shard_begin : 0;
    for (const auto& part : bucket.layout.fragments(comm_.rank())) {
      Fragment fragment{indices[part.slot], part.begin - bucket.layout.offsets[part.slot],
                        alias(shard_home, part.begin - home_begin, {part.length}, {1}), at::Tensor()};
      if (gradient_shards_) {
        fragment.gradient = alias(bucket.gradient_shard, part.begin - shard_begin, {part.length}, {1});
      }
      fragments.push_back(std::move(fragment));
    }
    if (bucket.transient) gathered_bytes_ += bucket.buffer.nbytes();
    buckets_.push_back(std::move(bucket));
  }
  std::sort(fragments.begin(), fragments.end(),
            [](const Fragment& a, const Fragment& b) { return a.parameter < b.parameter; });
  fragments_ = std::move(fragments);
  for (std::size_t i = 0; i < fragments_.size(); ++i) {
    fragment_of_[parameters_[fragments_[i].parameter].unsafeGetTensorImpl()] = i;
  }
}

bool ShardedParameters::adopted(const Bucket& bucket, std::size_t slot) const {
  const at::Tensor& parameter = parameters_[bucket.parameters[slot]];
  return parameter.is_alias_of(bucket.buffer) &&
         parameter.storage_offset() == bucket.buffer.storage_offset() + bucket.layout.offsets[slot] &&
         parameter.strides() == c10::IntArrayRef(flat_layout_strides(parameter));
}

void ShardedParameters::adopt(Bucket& bucket, std::size_t slot) {
  at::Tensor& parameter = parameters_[bucket.parameters[slot]];
  const std::vector<std::int64_t> strides = flat_layout_strides(parameter);
  at::Tensor place = alias(bucket.buffer, bucket.layout.offsets[slot], parameter.sizes(), strides);
  place.copy_(parameter);
  // set_ keeps the tensor's dtype; set_data takes the place's (before the
  // reducer hooks the gradient accumulators, which it resets).
  if (parameter.scalar_type() != place.scalar_type()) {
    parameter.set_data(place);
  } else {
    parameter.set_(place.storage(), place.storage_offset(), parameter.sizes(), strides);
  }
}

at::Tensor ShardedParameters::parameter_gradient(std::size_t index) const {
  const at::Tensor& parameter = parameters_[index];
  const at::Tensor& grad = parameter.grad();
  if (!grad.defined()) return grad;
  // The fragment walks the parameter's memory in order, and its gradient must
  // walk the gradient's in the same order: autograd lays a gradient out as
  // its (dense) parameter, so only a gradient set by hand can differ.
  // Strides of size-1 dimensions say nothing about the order (a 1x1
  // convolution's channels-last gradient of a contiguous weight).
  bool same_order = grad.is_non_overlapping_and_dense();
  for (std::int64_t d = 0; d < grad.dim() && same_order; ++d) {
    same_order = grad.size(d) == 1 || grad.stride(d) == parameter.stride(d);
  }
  if (!same_order) {
    throw UsageError(fmt::format(
        "libddp: a sharded parameter of shape [{}] has a gradient with strides [{}] where the parameter has [{}]; "
        "leave gradients to autograd, or give them the parameter's layout (at::empty_like(parameter))",
        fmt::join(parameter.sizes(), ", "), fmt::join(grad.strides(), ", "), fmt::join(parameter.strides(), ", ")));
  }
  return alias(grad, 0, {grad.numel()}, {1});
}

void ShardedParameters::attach_gradients(const std::vector<std::uint8_t>* globally_used) {
  c10::NoGradGuard no_grad;
  for (Fragment& fragment : fragments_) {
    at::Tensor& grad = fragment.value.mutable_grad();
    const bool used = globally_used == nullptr || (*globally_used)[fragment.parameter] != 0;
    at::Tensor source = gradient_shards_ ? fragment.gradient : parameter_gradient(fragment.parameter);
    if (used && source.defined()) {
      // Unreduced gradients of a narrower gathered dtype reach the master in its own.
      grad = source.scalar_type() == fragment.value.scalar_type() ? source : source.to(fragment.value.scalar_type());
    } else if (grad.defined()) {
      grad.zero_();  // what zero_grad() left, as one process keeps it for an unused parameter
    }
  }
  gather_pending_ = true;
}

void ShardedParameters::gather_for_caller() {
  const bool pending = gather_pending_;
  gather();
  gather_pending_ = pending;
}

void ShardedParameters::gather(bool defer_units) {
  c10::NoGradGuard no_grad;
  for (const Bucket& bucket : buckets_) {
    for (std::size_t slot = 0; slot < bucket.parameters.size(); ++slot) {
      if (adopted(bucket, slot)) continue;
      // The optimizer steps the shards, which a replaced storage no longer
      // feeds; and on a GPU the replacement also drops DDP's gradient hooks.
      throw UsageError(fmt::format(
          "libddp: a sharded parameter of shape [{}] no longer views its shard buffer: Module::load, torch::load "
          "or Module::to on the wrapped module replaced its storage. Load through model.load_module(archive) or "
          "model.load_sharded_checkpoint(directory), which write into the shards, and move the module to its "
          "device before wrapping it",
          fmt::join(parameters_[bucket.parameters[slot]].sizes(), ", ")));
    }
  }
  if (!gather_pending_) return;
  gather_pending_ = false;
  if (!gradient_shards_) {
    for (at::Tensor& parameter : parameters_) parameter.mutable_grad() = at::Tensor();
  }
  if (comm_.world_size() == 1) {
    for (Bucket& bucket : buckets_) cast_master(bucket);
    return;
  }
  // Each bucket's cast is queued just before its gather. A deferred unit's
  // runs, with its gather's launch, on a side stream: the forward then waits
  // for its first unit's cast only, and the other casts overlap it.
  const bool deferred_casts = defer_units && std::any_of(buckets_.begin(), buckets_.end(), [](const Bucket& bucket) {
                                return bucket.in_unit && !bucket.transient && bucket.master.defined();
                              });
  const c10::optional<c10::Stream> side = deferred_casts ? side_stream() : c10::nullopt;
  // The last buckets hold the first layers: gather them first, for the
  // forward that follows.
  // Collectives run in order on the communicator's stream: the buckets the
  // forward waits for at its start go first, or waiting for them would wait
  // for every deferred unit gather queued before them too. The order is the
  // same whether units are deferred or not: a rank that joined before its
  // first forward defers none, and must still pair its gathers with the others'.
  std::vector<std::shared_ptr<Work>> works;
  for (const bool units : {false, true}) {
    for (auto bucket = buckets_.rbegin(); bucket != buckets_.rend(); ++bucket) {
      if (bucket->transient || bucket->in_unit != units) continue;
      const bool deferred = units && defer_units;
      const c10::OptionalStreamGuard stream_guard(deferred ? side : c10::nullopt);
      cast_master(*bucket);
      const std::int64_t shard = bucket->layout.shard_numel;
      auto work = comm_.all_gather(bucket->buffer, bucket->buffer.narrow(0, comm_.rank() * shard, shard));
      if (deferred) {
        bucket->gathering = std::move(work);
      } else {
        works.push_back(std::move(work));
      }
    }
    for (auto& work : works) work->wait_stream();
    works.clear();
  }
}

void ShardedParameters::cast_master(Bucket& bucket) {
  // A resident bucket in a narrower dtype: its part is the cast of the
  // master the optimizer stepped (on one rank, the whole buffer).
  if (bucket.transient || !bucket.master.defined()) return;
  const std::int64_t shard = bucket.layout.shard_numel;
  bucket.buffer.narrow(0, comm_.rank() * shard, shard).copy_(bucket.master);
}

c10::optional<c10::Stream> ShardedParameters::side_stream() {
  const c10::Device device = comm_.device();
  if (device.type() != c10::DeviceType::CUDA) return c10::nullopt;  // CPU work runs in order anyway
  const c10::impl::VirtualGuardImpl guard(device.type());
  // One stream for good: the pool hands its streams out in turn, and one
  // shared with a collective or a capture would queue the casts behind it.
  // High priority: the forward waits for these casts.
  if (!side_stream_) side_stream_ = guard.getStreamFromGlobalPool(device, /*isHighPriority=*/true);
  // After what the current stream queued so far: the optimizer's step.
  c10::Event stepped(device.type());
  stepped.record(guard.getStream(device));
  stepped.block(*side_stream_);
  return side_stream_;
}

void ShardedParameters::start_gather(std::size_t index) {
  Bucket& bucket = buckets_[index];
  if (bucket.has_memory) return;
  // Fresh memory from the allocator, on the current stream, moved into the
  // storage the parameters already view.
  at::Tensor fresh = at::empty({bucket.layout.padded_numel}, bucket.buffer.options());
  c10::StorageImpl* storage = bucket.buffer.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(
      fresh.storage().unsafeGetStorageImpl()->set_data_ptr(at::DataPtr(nullptr, fresh.device())));
  storage->set_nbytes(fresh.nbytes());
  bucket.has_memory = true;
  gathered_bytes_ += bucket.buffer.nbytes();
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes_);
  const bool cast = bucket.master.scalar_type() != bucket.buffer.scalar_type();
  bucket.gathering =
      comm_.all_gather(bucket.buffer, cast ? bucket.master.to(bucket.buffer.scalar_type()) : bucket.master);
  if (recording_ != nullptr) recording_->push_back({ShardedCollective::kGather, index});
}

void ShardedParameters::begin_recording(int kind) {
  recording_ = &recorded_[kind];
  recording_->clear();
}

const std::vector<ShardedCollective>* ShardedParameters::recorded(int kind) const {
  auto it = recorded_.find(kind);
  return it == recorded_.end() ? nullptr : &it->second;
}

void ShardedParameters::finish_gather(std::size_t index) {
  start_gather(index);
  settle(index);
}

void ShardedParameters::settle(std::size_t index) {
  Bucket& bucket = buckets_[index];
  if (!bucket.gathering) return;
  bucket.gathering->wait_stream();
  bucket.gathering.reset();
}

void ShardedParameters::release(std::size_t index) {
  Bucket& bucket = buckets_[index];
  if (!bucket.transient || !bucket.has_memory) return;
  // A prefetch that was not used may still be in flight. NCCL recorded its
  // stream on the memory, but Gloo copies into it from a worker thread at
  // the end: wait for it (on the device for NCCL, on the host for Gloo).
  settle(index);
  gathered_bytes_ -= bucket.buffer.nbytes();
  c10::StorageImpl* storage = bucket.buffer.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, bucket.buffer.device()));
  storage->set_nbytes(0);
  bucket.has_memory = false;
}

std::vector<at::Tensor> ShardedParameters::local_parameters(const std::vector<at::Tensor>& module_parameters) const {
  std::vector<at::Tensor> result;
  for (const at::Tensor& parameter : module_parameters) {
    const c10::TensorImpl* key = parameter.unsafeGetTensorImpl();
    if (index_of_.count(key) == 0 && !parameter.requires_grad()) {
      result.push_back(parameter);  // frozen: replicated, and without a gradient an optimizer skips it
      continue;
    }
    if (index_of_.count(key) == 0) {
      throw UsageError(fmt::format(
          "libddp: local_parameters was given a tensor of shape {} that is not a trained parameter of the "
          "wrapped module; pass the module's own parameters (model.module()->parameters() or a subset)",
          fmt::join(parameter.sizes(), "x")));
    }
    if (auto it = fragment_of_.find(key); it != fragment_of_.end()) result.push_back(fragments_[it->second].value);
  }
  return result;
}

at::Tensor ShardedParameters::fragment_of(std::size_t index) const {
  auto it = fragment_of_.find(parameters_[index].unsafeGetTensorImpl());
  return it == fragment_of_.end() ? at::Tensor() : fragments_[it->second].value;
}

std::int64_t ShardedParameters::fragment_begin(std::size_t index) const {
  auto it = fragment_of_.find(parameters_[index].unsafeGetTensorImpl());
  return it == fragment_of_.end() ? -1 : fragments_[it->second].begin;
}

void ShardedParameters::settle_all() {
  for (std::size_t b = 0; b < buckets_.size(); ++b) settle(b);
}

void ShardedParameters::shards_written() {
  gather_pending_ = true;
  for (std::size_t b = 0; b < buckets_.size(); ++b) release(b);
}

void ShardedParameters::gather_whole(const std::function<at::Tensor(std::size_t index)>& part,
                                     const std::function<void(std::size_t index, const at::Tensor& values)>& whole) {
  c10::NoGradGuard no_grad;
  settle_all();  // the fragments alias resident buffers
  for (const Bucket& bucket : buckets_) {
    const std::int64_t shard_begin = comm_.rank() * bucket.layout.shard_numel;
    // In the trained dtype, not a narrower gathered one.
    const at::ScalarType dtype = trained_dtypes_[bucket.parameters.front()];
    at::Tensor mine = at::zeros({bucket.layout.shard_numel}, bucket.buffer.options().dtype(dtype));
    for (std::size_t slot = 0; slot < bucket.parameters.size(); ++slot) {
      auto it = fragment_of_.find(parameters_[bucket.parameters[slot]].unsafeGetTensorImpl());
      if (it == fragment_of_.end()) continue;
      const Fragment& fragment = fragments_[it->second];
      const at::Tensor values = part(fragment.parameter);
      if (!values.defined()) continue;
      mine.narrow(0, bucket.layout.offsets[slot] + fragment.begin - shard_begin, fragment.value.numel())
          .copy_(values.view({-1}));
    }
    at::Tensor all = at::empty({bucket.layout.padded_numel}, mine.options());
    comm_.all_gather(all, mine)->wait();
    for (std::size_t slot = 0; slot < bucket.parameters.size(); ++slot) {
      const at::Tensor& parameter = parameters_[bucket.parameters[slot]];
      whole(bucket.parameters[slot],
            alias(all, bucket.layout.offsets[slot], parameter.sizes(), flat_layout_strides(parameter)));
    }
  }
}

at::Tensor ShardedParameters::part_of(std::size_t index, const at::Tensor& values) const {
  auto it = fragment_of_.find(parameters_[index].unsafeGetTensorImpl());
  if (it == fragment_of_.end()) return {};
  const Fragment& fragment = fragments_[it->second];
  const at::Tensor& parameter = parameters_[index];
  // Laid out as the parameter, so that its memory order is the fragment's,
  // on the fragment's device (Module::load may have moved the parameter).
  at::Tensor laid_out = at::empty_strided(parameter.sizes(), flat_layout_strides(parameter), fragment.value.options());
  laid_out.copy_(values);
  return alias(laid_out, fragment.begin, {fragment.value.numel()}, {1}).clone();
}

std::int64_t ShardedParameters::buffer_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& bucket : buckets_) {
    if (!bucket.transient) bytes += bucket.buffer.nbytes();
    if (bucket.master.defined()) bytes += bucket.master.nbytes();
  }
  return bytes;
}

std::int64_t ShardedParameters::gradient_shard_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& bucket : buckets_) {
    if (bucket.gradient_shard.defined()) bytes += bucket.gradient_shard.numel() * bucket.gradient_shard.element_size();
  }
  return bytes;
}

std::int64_t ShardedParameters::converted_gradient_bytes() const {
  if (gradient_shards_) return 0;
  std::int64_t bytes = 0;
  for (const auto& fragment : fragments_) {
    if (fragment.value.scalar_type() == parameters_[fragment.parameter].scalar_type()) continue;
    bytes += fragment.value.numel() * fragment.value.element_size();
  }
  return bytes;
}

std::int64_t ShardedParameters::trained_elements() const {
  std::int64_t elements = 0;
  for (const auto& bucket : buckets_) elements += bucket.layout.numel;
  return elements;
}

std::int64_t ShardedParameters::local_elements() const {
  std::int64_t elements = 0;
  for (const auto& fragment : fragments_) elements += fragment.value.numel();
  return elements;
}

std::int64_t ShardedParameters::padding_elements() const {
  std::int64_t elements = 0;
  for (const auto& bucket : buckets_) elements += bucket.layout.padded_numel - bucket.layout.numel;
  return elements;
}

}  // namespace ddp::detail
