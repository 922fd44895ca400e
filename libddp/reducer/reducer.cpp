#include "reducer/reducer.h"

#include <algorithm>
#include <unordered_set>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <ddp/errors.h>

#include "cuda/stream_capture.h"
#include "reducer/bucket_assignment.h"
#include "reducer/row_major.h"
#include "reducer/timeline.h"
#include "reducer/sparse_gradients.h"
#include "sharding/sharded_parameters.h"
#include "sharding/unit_schedule.h"

namespace ddp::detail {

Reducer::Reducer(std::vector<at::Tensor> parameters, std::vector<std::string> names,
                 const std::vector<std::vector<std::size_t>>& plan, Communicator& comm, Config config)
    : parameters_(std::move(parameters)),
      names_(std::move(names)),
      comm_(comm),
      config_(std::move(config)),
      ready_(parameters_.size(), 0),
      used_(parameters_.size(), 0),
      used_without_sync_(parameters_.size(), 0) {
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    if (parameters_[i].device() != comm_.device()) {
      throw UsageError(fmt::format(
          "libddp: parameter '{}' is on {}, but the process group communicates on {}; move the model with "
          "model->to(process_group->device()) before wrapping it in DistributedDataParallel",
          names_[i], parameters_[i].device().str(), comm_.device().str()));
    }
  }
  build_buckets(plan);
}

Reducer::~Reducer() {
  for (std::size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void Reducer::install_hooks() {
  accumulators_.resize(parameters_.size());
  hook_keys_.resize(parameters_.size());
  for (std::size_t i = 0; i < parameters_.size(); ++i) hook(i, torch::autograd::impl::grad_accumulator(parameters_[i]));
  accumulator_stream_ = current_stream();
}

c10::Stream Reducer::current_stream() const {
  const c10::Device device = comm_.device();
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

void Reducer::follow_current_stream() {
  const c10::Stream current = current_stream();
  if (current == accumulator_stream_) return;
  // Autograd holds the nodes weakly: once ours are dropped, grad_accumulator()
  // makes new ones, on the current stream.
  for (std::size_t i = 0; i < accumulators_.size(); ++i) {
    accumulators_[i]->del_post_hook(hook_keys_[i]);
    accumulators_[i] = nullptr;
  }
  install_hooks();
}

void Reducer::hook(std::size_t index, compat::GradAccumulatorPtr accumulator) {
  std::weak_ptr<Reducer> weak = weak_from_this();
  accumulators_[index] = std::move(accumulator);
  hook_keys_[index] = accumulators_[index]->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
      [weak, index](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
        if (auto self = weak.lock()) self->on_gradient_ready(index);
        return outputs;
      }));
}

void Reducer::follow_replaced_accumulators() {
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    if (!parameters_[i].requires_grad()) {
      throw UsageError(fmt::format(
          "libddp: parameter '{}' no longer requires a gradient; DistributedDataParallel reduces the parameters "
          "that required one when it was built: set requires_grad before wrapping the module (or wrap it anew)",
          names_[i]));
    }
    auto current = torch::autograd::impl::grad_accumulator(parameters_[i]);
    if (current == accumulators_[i]) continue;
    accumulators_[i]->del_post_hook(hook_keys_[i]);
    hook(i, std::move(current));
  }
}

void Reducer::build_buckets(const std::vector<std::vector<std::size_t>>& plan) {
  c10::NoGradGuard no_grad;
  std::vector<Bucket> buckets;
  location_.assign(parameters_.size(), {0, 0});
  for (const auto& indices : plan) {
    Bucket bucket;
    bucket.parameters = indices;
    std::int64_t total = 0;
    for (std::size_t index : indices) total += parameters_[index].numel();
    bucket.bytes = static_cast<std::size_t>(total) * parameters_[indices.front()].element_size();
    bucket.numel = total;
    bucket.padded_numel = total;
    if (config_.sharded) {
      bucket.padded_numel = config_.sharded->layout(buckets.size()).padded_numel;
      bucket.shard = config_.sharded->gradient_shard(buckets.size());
    }
    for (std::size_t slot = 0; slot < indices.size(); ++slot) location_[indices[slot]] = {buckets.size(), slot};
    // Without reduce nothing is ever gathered: the buckets only count readiness.
    if (config_.reduce && !frees_buckets()) {
      allocate(bucket);
      for (std::size_t slot = 0; slot < indices.size(); ++slot) {
        // Gradients accumulated so far (no_sync, or before a rebuild) move along.
        at::Tensor& grad = parameters_[indices[slot]].mutable_grad();
        if (!grad.defined()) continue;
        bucket.views[slot].copy_(grad);
        if (config_.gradient_as_bucket_view) grad = bucket.views[slot];
      }
    }
    buckets.push_back(std::move(bucket));
  }
  buckets_ = std::move(buckets);
}

bool Reducer::frees_buckets() const { return config_.free_reduced_buckets && comm_.world_size() > 1; }

bool Reducer::allocate(Bucket& bucket, bool zeroed) const {
  const at::Tensor& first = parameters_[bucket.parameters.front()];
  // On one rank this rank's shard is the whole bucket: reducing is a no-op
  // (unless the gradients come in a narrower dtype than the shard keeps).
  const bool shard_is_bucket =
      bucket.shard.defined() && comm_.world_size() == 1 && bucket.shard.scalar_type() == first.scalar_type();
  if (shard_is_bucket) {
    bucket.buffer = bucket.shard;
  } else {
    bucket.buffer =
        zeroed ? at::zeros({bucket.padded_numel}, first.options()) : at::empty({bucket.padded_numel}, first.options());
  }
  bucket.views.clear();
  std::int64_t offset = 0;
  for (std::size_t index : bucket.parameters) {
    const at::Tensor& parameter = parameters_[index];
    // Slices keep the parameter's layout, so accumulating into them needs no
    // layout change; optimizers may detach_() them (LibTorch 1.x zero_grad does).
    bucket.views.push_back(alias(bucket.buffer, offset, parameter.sizes(), flat_layout_strides(parameter)));
    offset += parameter.numel();
  }
  return !shard_is_bucket && !zeroed;
}

void Reducer::set_sync(bool sync) {
  std::lock_guard<std::mutex> lock(mutex_);
  sync_ = sync;
}

bool Reducer::sync() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sync_;
}

bool Reducer::backward_due() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return armed_;
}

std::vector<std::size_t> Reducer::bucket_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::size_t> bytes;
  for (const auto& bucket : buckets_) bytes.push_back(bucket.bytes);
  return bytes;
}

std::int64_t Reducer::allocated_bucket_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::int64_t bytes = 0;
  for (const auto& bucket : buckets_) {
    if (bucket.buffer.defined() && !bucket.buffer.is_same(bucket.shard)) {
      bytes += bucket.buffer.numel() * bucket.buffer.element_size();
    }
  }
  return bytes;
}

void Reducer::prepare_for_forward() {
  // A forward without autograd has no backward: between a forward and its
  // backward (a target computed under NoGradGuard) it must leave that
  // backward armed, and on one rank alone (rank 0 evaluating) it must not
  // rebuild the buckets, which is collective. As PyTorch's DDP.
  if (!at::GradMode::is_enabled()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = false;  // a forward whose backward never ran leaves nothing behind
  follow_current_stream();
  const bool rebuild = config_.reduce && !config_.sharded && !rebuilt_ && reduced_iterations_ >= 1 &&
                       (!config_.find_unused_parameters || config_.static_graph) &&
                       ready_order_.size() == parameters_.size();
  if (!rebuild) return;
  if (detail::current_stream_capturing()) {
    throw UsageError(
        "ddp::DistributedDataParallel rebuilds its buckets in its second iteration (in rank 0's order of ready "
        "gradients, sent to every rank), which cannot be recorded into a CUDA graph: run at least two eager steps "
        "before the recording (ddp::CapturedStepOptions().warmup_steps(2) or more)");
  }
  // Ranks may see gradients become ready in different orders; all must use
  // the same buckets, so rank 0's order wins.
  at::Tensor order = at::tensor(std::vector<std::int64_t>(ready_order_.begin(), ready_order_.end()), at::kLong)
                         .to(comm_.device());
  comm_.broadcast(order, 0)->wait();
  order = order.cpu();
  const auto* indices = order.data_ptr<std::int64_t>();
  const std::vector<std::size_t> agreed(indices, indices + order.numel());
  build_buckets(assign_buckets(parameters_, agreed, config_.first_bucket_bytes, config_.bucket_bytes));
  rebuilt_ = true;
}

void Reducer::start_backward() {
  caller_stream_ = current_stream();
  if (config_.timeline) config_.timeline->begin_backward();
  finalize_queued_ = false;
  unused_marked_ = false;
  next_bucket_ = 0;
  std::fill(ready_.begin(), ready_.end(), 0);
  std::fill(used_.begin(), used_.end(), 0);
  for (auto& bucket : buckets_) {
    bucket.pending = bucket.parameters.size();
    bucket.to_copy.clear();
  }
  unused_.clear();
}

void Reducer::prepare_for_backward(const std::vector<at::Tensor>& outputs) {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = sync_;
  if (!armed_) return;
  // torch::load and Module::load replace parameters' data with set_(), and
  // autograd then accumulates their gradients through a new node: without
  // this the hooks would never fire and the ranks would silently drift apart.
  follow_replaced_accumulators();
  start_backward();
  if (config_.find_unused_parameters) {
    if (static_unused_) {
      unused_ = *static_unused_;
    } else {
      if (outputs.empty()) {
        throw UsageError(
            "libddp: find_unused_parameters needs the module's forward() to return tensors (a Tensor, or a "
            "vector, tuple or pair of them) so that it can walk the autograd graph from them");
      }
      unused_ = find_unused(outputs);
      if (config_.units) check_same_unused_on_all_ranks();
      if (config_.static_graph) static_unused_ = unused_;
    }
  }
}

void Reducer::shadow_backward() {
  begin_shadow_backward();
  for (std::size_t bucket = 0; bucket < buckets_.size(); ++bucket) shadow_bucket(bucket);
  finalize_backward();
}

void Reducer::begin_shadow_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = true;
  start_backward();
  c10::NoGradGuard no_grad;
  for (at::Tensor& parameter : parameters_) parameter.mutable_grad() = at::Tensor();
  unused_marked_ = true;
}

void Reducer::shadow_bucket(std::size_t bucket) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Every parameter unused: the bucket is zeros, and it launches through the
  // comm hook, in bucket order, as in a backward.
  for (std::size_t index : buckets_[bucket].parameters) mark_ready(index, /*used=*/false);
}

void Reducer::set_averaging_ranks(int ranks) {
  std::lock_guard<std::mutex> lock(mutex_);
  averaging_ranks_ = ranks;
}

void Reducer::check_same_unused_on_all_ranks() const {
  // Per parameter: whether some rank left it unused, and whether some rank used it.
  const auto count = static_cast<std::int64_t>(parameters_.size());
  std::vector<std::int32_t> flags(2 * parameters_.size(), 0);
  std::vector<std::uint8_t> unused(parameters_.size(), 0);
  for (std::size_t index : unused_) unused[index] = 1;
  for (std::size_t i = 0; i < parameters_.size(); ++i) flags[unused[i] ? i : parameters_.size() + i] = 1;
  at::Tensor agreed = at::tensor(flags, at::kInt).to(comm_.device());
  comm_.all_reduce(agreed, ReduceOp::kMax)->wait();
  agreed = agreed.cpu();
  const auto* some = agreed.data_ptr<std::int32_t>();
  std::vector<std::size_t> split;
  for (std::int64_t i = 0; i < count; ++i) {
    if (some[i] != 0 && some[count + i] != 0) split.push_back(static_cast<std::size_t>(i));
  }
  if (split.empty()) return;
  throw UsageError(fmt::format(
      "libddp: with Sharding::kFull every rank must use the same parameters in an iteration, but some ranks left "
      "unused what others used: {}. Run the same modules on every rank (a branch taken by some ranks only can be "
      "run with zero weight on the others), or use Sharding::kGradients",
      names_of(split)));
}

std::vector<std::uint8_t> Reducer::used_by(const std::vector<at::Tensor>& outputs) const {
  std::vector<std::uint8_t> used(parameters_.size(), 1);
  for (std::size_t index : find_unused(outputs)) used[index] = 0;
  return used;
}

std::vector<std::size_t> Reducer::find_unused(const std::vector<at::Tensor>& outputs) const {
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<const torch::autograd::Node*> stack;
  auto visit = [&](const torch::autograd::Node* node) {
    if (node != nullptr && seen.insert(node).second) stack.push_back(node);
  };
  for (const at::Tensor& output : outputs) {
    if (output.defined() && output.requires_grad()) {
      visit(output.grad_fn() ? output.grad_fn().get() : torch::autograd::impl::grad_accumulator(output).get());
    }
  }
  while (!stack.empty()) {
    const torch::autograd::Node* node = stack.back();
    stack.pop_back();
    for (const auto& edge : node->next_edges()) visit(edge.function.get());
  }
  std::vector<std::size_t> unused;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    if (seen.count(accumulators_[i].get()) == 0) unused.push_back(i);
  }
  return unused;
}

void Reducer::on_gradient_ready(std::size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (config_.units) config_.units->gradient_ready(index);
  if (!armed_) {  // no_sync, or a forward that did not go through DDP
    // Its gradient waits in .grad for the next synchronised backward, which
    // must reduce it even if that backward's own forward did not use it.
    used_without_sync_[index] = 1;
    return;
  }
  if (!finalize_queued_) {
    finalize_queued_ = true;
    std::weak_ptr<Reducer> weak = weak_from_this();
    torch::autograd::Engine::get_default_engine().queue_callback([weak] {
      if (auto self = weak.lock()) self->finalize_backward();
    });
  }
  if (!unused_marked_) {
    // Unused parameters are marked when backward starts, not after forward:
    // a forward whose backward never comes must not launch reductions.
    unused_marked_ = true;
    for (std::size_t unused : unused_) mark_ready(unused, /*used=*/false);
  }
  mark_ready(index, /*used=*/true);
}

void Reducer::mark_ready(std::size_t index, bool used) {
  if (ready_[index]) {
    throw UsageError(fmt::format(
        "libddp: parameter '{}' received its gradient twice in one backward pass. DistributedDataParallel "
        "reduces each gradient once per backward (static_graph or not): run backward once per forward, and "
        "do not let a nested backward (reentrant activation checkpointing) accumulate a parameter's gradient "
        "a second time; recompute activations inside the one graph instead.",
        names_[index]));
  }
  ready_[index] = 1;
  used_[index] = used || used_without_sync_[index] ? 1 : 0;
  if (reduced_iterations_ == 0) ready_order_.push_back(index);

  const auto [bucket_index, slot] = location_[index];
  Bucket& bucket = buckets_[bucket_index];
  const at::Tensor& grad = parameters_[index].grad();
  // Without reduction the buckets still count down: a parameter that never
  // gets its gradient is reported the same way on one process as on many.
  if (config_.reduce && grad.defined()) {
    // A gradient that is not the bucket's own slice (zero_grad set it to
    // none, views are off, or the bucket is not allocated yet) is copied in
    // once the whole bucket is ready: one kernel per bucket instead of one
    // per parameter.
    if (bucket.views.empty() || !grad.is_alias_of(bucket.views[slot])) bucket.to_copy.push_back(slot);
  } else if (config_.reduce && !bucket.views.empty()) {  // an unallocated bucket starts as zeros
    c10::NoGradGuard no_grad;
    bucket.views[slot].zero_();  // contributes nothing; the parameter keeps no gradient unless another rank used it
  }
  if (--bucket.pending == 0) {
    if (config_.reduce) gather_into_bucket(bucket);
    launch_ready_buckets();
  }
}

void Reducer::zero_all_but(Bucket& bucket, const std::vector<std::size_t>& sorted_slots) {
  if (bucket.padded_numel > bucket.numel)
    bucket.buffer.narrow(0, bucket.numel, bucket.padded_numel - bucket.numel).zero_();
  auto next = sorted_slots.begin();
  for (std::size_t slot = 0; slot < bucket.views.size(); ++slot) {
    if (next != sorted_slots.end() && *next == slot) {
      ++next;
    } else {
      bucket.views[slot].zero_();  // a parameter without a gradient on this rank contributes zeros
    }
  }
}

void Reducer::gather_into_bucket(Bucket& bucket) {
  c10::NoGradGuard no_grad;
  // A bucket allocated here (the sharded modes free theirs after each
  // reduction) is mostly overwritten by the copies below: only the rest is
  // zeroed, not the whole buffer first (a full extra write of the gradients).
  const bool uninitialised = bucket.views.empty() && allocate(bucket, /*zeroed=*/false);
  std::sort(bucket.to_copy.begin(), bucket.to_copy.end());  // ready order -> layout order
  if (uninitialised) zero_all_but(bucket, bucket.to_copy);
  bool one_kernel = bucket.to_copy.size() == bucket.parameters.size();
  std::vector<at::Tensor> flat;
  for (std::size_t slot : bucket.to_copy) {
    const at::Tensor& grad = parameters_[bucket.parameters[slot]].grad();
    // The slice has the parameter's layout; a gradient laid out the same way
    // is copied as its memory, in one concatenation for the whole bucket.
    one_kernel = one_kernel && same_memory_layout(grad, bucket.views[slot]);
    if (one_kernel) flat.push_back(grad.as_strided({grad.numel()}, {1}, grad.storage_offset()));
  }
  if (one_kernel) {
    at::Tensor gradients = bucket.buffer.narrow(0, 0, bucket.numel);  // the padding stays zero
    at::cat_out(gradients, flat, 0);
  } else {
    for (std::size_t slot : bucket.to_copy) bucket.views[slot].copy_(parameters_[bucket.parameters[slot]].grad());
  }
  if (config_.gradient_as_bucket_view) {
    for (std::size_t slot : bucket.to_copy) parameters_[bucket.parameters[slot]].mutable_grad() = bucket.views[slot];
  }
  bucket.to_copy.clear();
}

void Reducer::launch_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    Bucket& bucket = buckets_[next_bucket_];
    if (!config_.reduce) {
      bucket.finish = [] {};
      ++next_bucket_;
      continue;
    }
    bucket.observer = config_.timeline ? config_.timeline->observe(comm_, next_bucket_,
                                                                   bucket.buffer.numel() * bucket.buffer.element_size())
                                       : nullptr;
    bucket.finish = config_.comm_hook(bucket.observer ? *bucket.observer : comm_,
                                      GradBucket{next_bucket_, bucket.buffer, bucket.shard});
    if (!bucket.finish) {
      throw UsageError(fmt::format(
          "libddp: the comm hook returned an empty function for bucket {}; return one that waits for the bucket's "
          "reduction, or [] {{}} when nothing is left to do",
          next_bucket_));
    }
    if (config_.sharded) config_.sharded->note_reduction(next_bucket_);
    if (frees_buckets()) {
      // The reduction holds the memory until it ends (the communicator
      // protects its tensors); the full gradients are not needed any more.
      for (std::size_t index : bucket.parameters) parameters_[index].mutable_grad() = at::Tensor();
      bucket.buffer = at::Tensor();
      bucket.views.clear();
    }
    ++next_bucket_;
  }
}

std::string Reducer::names_of(const std::vector<std::size_t>& indices) const {
  std::vector<std::string> names;
  for (std::size_t index : indices) names.push_back(names_[index]);
  return fmt::format("{}", fmt::join(names, ", "));
}

void Reducer::finalize_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  const c10::OptionalStreamGuard stream_guard(caller_stream_);
  armed_ = false;
  std::fill(used_without_sync_.begin(), used_without_sync_.end(), 0);  // mark_ready took it into used_
  if (next_bucket_ < buckets_.size()) {
    std::vector<std::size_t> missing;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      if (!ready_[i]) missing.push_back(i);
    }
    if (config_.static_graph && config_.find_unused_parameters && reduced_iterations_ > 0) {
      throw UsageError(fmt::format(
          "libddp: on rank {}, these parameters received no gradient in this backward pass, though the first "
          "iteration used them: {}. static_graph promises that every iteration uses the parameters the first one "
          "used; if the parameters in use change between iterations, drop static_graph and keep "
          "find_unused_parameters.",
          comm_.rank(), names_of(missing)));
    }
    throw UsageError(fmt::format(
        "libddp: on rank {}, these parameters received no gradient in this backward pass, so their gradients "
        "cannot be reduced and the other ranks would wait for them: {}. If the model does not use every "
        "parameter in every iteration, pass DistributedDataParallelOptions().find_unused_parameters(true); "
        "otherwise make the loss depend on every parameter (or set requires_grad(false) on those it must not "
        "train).",
        comm_.rank(), names_of(missing)));
  }
  if (config_.timeline) config_.timeline->end_backward_compute();
  for (auto& bucket : buckets_) {
    bucket.finish();  // orders the caller's stream after the reduction
    bucket.finish = nullptr;
    bucket.observer.reset();
  }
  const int averaging_ranks = averaging_ranks_ > 0 ? averaging_ranks_ : comm_.world_size();
  if (config_.reduce && averaging_ranks != comm_.world_size()) {
    // The hook averaged over every rank; ranks out of batches gave zeros.
    c10::NoGradGuard no_grad;
    const double rescale = static_cast<double>(comm_.world_size()) / averaging_ranks;
    for (auto& bucket : buckets_) (config_.sharded ? bucket.shard : bucket.buffer).mul_(rescale);
  }
  if (config_.sharded) {
    std::vector<std::uint8_t> used;
    if (config_.find_unused_parameters) used = globally_used();
    config_.sharded->attach_gradients(config_.find_unused_parameters ? &used : nullptr);
    if (config_.reduce) {
      // Each rank keeps its shard of the average; the local full gradients
      // are spent, and the next backward must not add to them. (Unreduced,
      // they are what the fragments' gradients alias until the next forward.)
      c10::NoGradGuard no_grad;
      for (at::Tensor& parameter : parameters_) parameter.mutable_grad() = at::Tensor();
    }
    if (config_.units) config_.units->after_backward();
  } else if (config_.reduce && config_.find_unused_parameters) {
    adopt_globally_used_gradients(globally_used());
  }
  if (config_.reduce && config_.sparse) config_.sparse->average(averaging_ranks);
  if (config_.reduce && !config_.sharded && !config_.gradient_as_bucket_view) {
    c10::NoGradGuard no_grad;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      at::Tensor& grad = parameters_[i].mutable_grad();
      const auto [bucket_index, slot] = location_[i];
      if (grad.defined()) grad.copy_(buckets_[bucket_index].views[slot]);
    }
  }
  ++reduced_iterations_;
}

std::vector<std::uint8_t> Reducer::globally_used() {
  if (static_globally_used_) return *static_globally_used_;
  at::Tensor used = at::tensor(std::vector<std::int32_t>(used_.begin(), used_.end()), at::kInt).to(comm_.device());
  comm_.all_reduce(used, ReduceOp::kMax)->wait_stream();
  used = used.cpu();
  const auto* flags = used.data_ptr<std::int32_t>();
  std::vector<std::uint8_t> result(flags, flags + used.numel());
  if (config_.static_graph) static_globally_used_ = result;
  return result;
}

void Reducer::adopt_globally_used_gradients(const std::vector<std::uint8_t>& used) {
  // A parameter no rank used keeps no gradient, exactly as in single-process
  // training, so optimizers skip it; one that some rank used gets the average.
  c10::NoGradGuard no_grad;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    at::Tensor& grad = parameters_[i].mutable_grad();
    if (grad.defined() || used[i] == 0) continue;
    const auto [bucket_index, slot] = location_[i];
    const at::Tensor& view = buckets_[bucket_index].views[slot];
    grad = config_.gradient_as_bucket_view ? view : view.clone();
  }
}

}  // namespace ddp::detail
