#include <ddp/distributed_data_parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <unordered_set>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <ddp/errors.h>
#include <ddp/optim.h>

#include "checkpoint/module_state.h"
#include "checkpoint/optimizer_param_state.h"
#include "checkpoint/optimizer_state.h"
#include "checkpoint/sharded_checkpoint.h"
#include "reducer/bucket_assignment.h"
#include "reducer/buffer_sync.h"
#include "reducer/join_state.h"
#include "reducer/model_agreement.h"
#include "reducer/reducer.h"
#include "reducer/sparse_gradients.h"
#include "reducer/timeline.h"
#include "sharding/shard_units.h"
#include "sharding/sharded_parameters.h"
#include "sharding/unit_schedule.h"

namespace ddp::detail {
namespace {

std::size_t mebibytes_to_bytes(double mebibytes, const char* option) {
  if (!(mebibytes > 0) || !std::isfinite(mebibytes)) {
    throw UsageError(fmt::format("DistributedDataParallelOptions::{} must be a positive number of MiB, got {}",
                                 option, mebibytes));
  }
  return static_cast<std::size_t>(std::max(1.0, mebibytes * (1 << 20)));
}

std::int64_t bytes_of(const at::Tensor& tensor) { return tensor.defined() ? tensor.numel() * tensor.element_size() : 0; }

/// Bytes of the tensors in an optimizer's state, for the optimizers LibTorch
/// has; -1 for a state type it does not know.
std::int64_t state_bytes(const torch::optim::Optimizer& optimizer) {
  std::int64_t bytes = 0;
  for (const auto& entry : optimizer.state()) {
    const torch::optim::OptimizerParamState* state = entry.second.get();
    if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(state)) {
      bytes += bytes_of(adamw->exp_avg()) + bytes_of(adamw->exp_avg_sq()) + bytes_of(adamw->max_exp_avg_sq());
    } else if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(state)) {
      bytes += bytes_of(adam->exp_avg()) + bytes_of(adam->exp_avg_sq()) + bytes_of(adam->max_exp_avg_sq());
    } else if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(state)) {
      bytes += bytes_of(sgd->momentum_buffer());
    } else if (const auto* adagrad = dynamic_cast<const torch::optim::AdagradParamState*>(state)) {
      bytes += bytes_of(adagrad->sum());
    } else if (const auto* rmsprop = dynamic_cast<const torch::optim::RMSpropParamState*>(state)) {
      bytes += bytes_of(rmsprop->square_avg()) + bytes_of(rmsprop->momentum_buffer()) + bytes_of(rmsprop->grad_avg());
    } else {
      return -1;
    }
  }
  return bytes;
}

/// The dtype the sharded modes gather units in if it differs from the
/// parameters' (Undefined otherwise); UsageError for what cannot be gathered so.
at::ScalarType checked_param_dtype(const DistributedDataParallelOptions& options,
                                   const std::vector<at::Tensor>& trained, const std::vector<std::string>& names) {
  if (!options.param_dtype()) return at::ScalarType::Undefined;
  const c10::ScalarType dtype = *options.param_dtype();
  if (options.sharding() == Sharding::kNone || options.shard_units().empty()) {
    throw UsageError(fmt::format(
        "libddp: param_dtype({}) applies to the parameters of shard units, which the sharded modes gather from fp32 "
        "masters, but {}; set .sharding(ddp::Sharding::kGradients) (or kOptimizer, kFull) and name the units with "
        ".shard_units({{\"layers.*\"}}), or run under autocast without param_dtype",
        c10::toString(dtype), options.sharding() == Sharding::kNone ? "sharding is none" : "no shard_units are named"));
  }
  if (dtype != at::kBFloat16 && dtype != at::kHalf && dtype != at::kFloat) {
    throw UsageError(fmt::format("libddp: param_dtype must be bf16, fp16 or fp32, got {}", c10::toString(dtype)));
  }
  for (std::size_t i = 0; i < trained.size(); ++i) {
    if (trained[i].scalar_type() != at::kFloat) {
      throw UsageError(fmt::format(
          "libddp: param_dtype({}) gathers copies of fp32 parameters, but '{}' is {}; keep the model in fp32 (the "
          "shards are its master weights) or leave param_dtype unset",
          c10::toString(dtype), names[i], c10::toString(trained[i].scalar_type())));
    }
  }
  return dtype == at::kFloat ? at::ScalarType::Undefined : dtype;
}

}  // namespace

DataParallelCore::DataParallelCore(std::shared_ptr<torch::nn::Module> module,
                                   std::shared_ptr<ProcessGroup> process_group,
                                   const DistributedDataParallelOptions& options)
    : module_(std::move(module)), process_group_(std::move(process_group)), options_(options) {
  if (!module_) throw UsageError("libddp: DistributedDataParallel was given no module");
  if (!process_group_) throw UsageError("libddp: DistributedDataParallel was given no process group");
  Communicator& comm = process_group_->communicator();

  std::vector<at::Tensor> trained;
  std::vector<std::string> names;
  std::vector<at::Tensor> state;  // every parameter and buffer, copied from rank 0
  std::vector<std::string> described;  // what each of `state` is, for the check that ranks agree
  // A parameter registered in two modules (tied embedding and output
  // weights) is one parameter, under its first name, as in PyTorch.
  std::unordered_set<const c10::TensorImpl*> seen;
  // Which gradients are sparse is part of the model too: a rank that reduces
  // an embedding's gradient sparsely while another reduces it in a bucket
  // would pair unrelated collectives.
  const std::vector<at::Tensor> sparse = SparseGradients::find(*module_);
  const auto has_sparse_gradient = [&](const at::Tensor& parameter) {
    return std::any_of(sparse.begin(), sparse.end(),
                       [&](const at::Tensor& s) { return s.unsafeGetTensorImpl() == parameter.unsafeGetTensorImpl(); });
  };
  for (const auto& item : module_->named_parameters()) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    state.push_back(item.value());
    const bool is_trained = item.value().requires_grad();
    described.push_back(fmt::format("{}{}parameter '{}'", is_trained ? "" : "frozen ",
                                    has_sparse_gradient(item.value()) ? "sparse-gradient " : "", item.key()));
    if (!is_trained) continue;
    trained.push_back(item.value());
    names.push_back(item.key());
  }
  std::vector<at::Tensor> buffers;
  for (const auto& item : module_->named_buffers()) {
    buffers.push_back(item.value());
    described.push_back(fmt::format("buffer '{}'", item.key()));
  }
  state.insert(state.end(), buffers.begin(), buffers.end());
  // Every tensor rank 0's copy overwrites, not only the trained ones: a frozen
  // parameter or buffer of another shape would be filled wrongly, silently.
  // Before any rank-local refusal, so that a rank that differs cannot leave
  // the others waiting in this collective.
  check_same_model_on_all_ranks(comm, described, state);
  if (trained.empty()) throw UsageError("libddp: the module has no parameter that requires a gradient");
  broadcast_coalesced(comm, state, 0);
  if (options.broadcast_buffers() && !buffers.empty() && process_group_->world_size() > 1) {
    buffer_sync_ = std::make_unique<BufferSync>(std::move(buffers));
  }

  Reducer::Config config;
  config.first_bucket_bytes = mebibytes_to_bytes(options.first_bucket_cap_mb(), "first_bucket_cap_mb");
  config.bucket_bytes = mebibytes_to_bytes(options.bucket_cap_mb(), "bucket_cap_mb");
  config.gradient_as_bucket_view = options.gradient_as_bucket_view();
  config.find_unused_parameters = options.find_unused_parameters();
  config.static_graph = options.static_graph();
  config.comm_hook = options.comm_hook() ? options.comm_hook() : comm_hooks::average();
  config.reduce = options.comm_hook() != nullptr || process_group_->world_size() > 1;
  std::string timeline_path = options.timeline_path();
  const char* prefix = std::getenv("DDP_TIMELINE");
  if (timeline_path.empty() && prefix != nullptr && *prefix != '\0') {
    timeline_path = fmt::format("{}.rank{}.json", prefix, process_group_->rank());
  }
  if (options.record_timeline() || !timeline_path.empty()) {
    timeline_ = std::make_shared<Timeline>(comm.device(), process_group_->rank(), timeline_path);
    config.timeline = timeline_;
  }
  const bool full = options.sharding() == Sharding::kFull;
  if (full && options.shard_units().empty()) {
    throw UsageError("libddp: Sharding::kFull needs units to gather one at a time: name them with "
                     "DistributedDataParallelOptions().shard_units({\"layers.*\"}) (module paths, '*' for one "
                     "segment), or use Sharding::kGradients");
  }
  if (options.sharding() == Sharding::kNone && !options.shard_units().empty()) {
    throw UsageError(
        "libddp: shard_units is set but sharding is none; units are gathered only in the sharded "
        "modes: set .sharding(ddp::Sharding::kFull) (or kOptimizer/kGradients, where units only "
        "pace the parameter gathers) or drop shard_units");
  }
  trained_ = trained;
  trained_names_ = names;
  // Sparse gradients stay out of the dense buckets (and cannot be sharded).
  if (!sparse.empty()) {
    std::vector<at::Tensor> dense, sparse_params;
    std::vector<std::string> dense_names, sparse_names;
    for (std::size_t i = 0; i < trained.size(); ++i) {
      const bool is_sparse = has_sparse_gradient(trained[i]);
      (is_sparse ? sparse_params : dense).push_back(trained[i]);
      (is_sparse ? sparse_names : dense_names).push_back(names[i]);
    }
    if (options.sharding() != Sharding::kNone) {
      throw UsageError(fmt::format(
          "libddp: '{}' has sparse gradients (an embedding with sparse(true)), which sharding mode {} cannot shard; "
          "build the embedding with sparse(false) or use Sharding::kNone",
          sparse_names.front(), to_string(options.sharding())));
    }
    if (dense.empty()) {
      throw UsageError(
          "libddp: every trained parameter has sparse gradients; DistributedDataParallel needs at "
          "least one with a dense gradient, whose reduction marks the end of backward");
    }
    config.sparse = std::make_shared<SparseGradients>(std::move(sparse_params), std::move(sparse_names), comm);
    trained = std::move(dense);
    names = std::move(dense_names);
  }
  const at::ScalarType param_dtype = checked_param_dtype(options, trained, names);
  std::vector<std::vector<std::size_t>> plan;
  ShardUnits units;
  std::vector<int> unit_of_bucket;
  const bool has_units = !options.shard_units().empty();
  if (has_units) {
    units = find_shard_units(*module_, trained, options.shard_units());
    plan = unit_buckets(trained, units, config.first_bucket_bytes, config.bucket_bytes, unit_of_bucket);
  } else {
    plan = initial_buckets(trained, config.first_bucket_bytes, config.bucket_bytes);
  }
  if (options.sharding() != Sharding::kNone) {
    // On one rank with the averaging hook there is nothing to reduce: the
    // shard is the whole gradient, which then stays where autograd put it.
    // One rank's shard is the whole unit: gathering would only copy it (4% of
    // a LLaMA step measured on one H200), so there, as FSDP does with
    // NO_SHARD, units stay whole while the schedule still checks in_unit.
    // A narrower param_dtype makes the gather a cast, which autocast would do anyway.
    const bool transient_units = full && (comm.world_size() > 1 || param_dtype != at::ScalarType::Undefined);
    sharded_ = std::make_shared<ShardedParameters>(trained, plan, comm, /*gradient_shards=*/config.reduce,
                                                   unit_of_bucket, transient_units, param_dtype);
    config.sharded = sharded_;
    config.free_reduced_buckets = options.sharding() == Sharding::kGradients || full;
  }
  if (has_units) {
    std::vector<std::size_t> bucket_of_unit(units.names.size());
    for (std::size_t bucket = 0; bucket < unit_of_bucket.size(); ++bucket) {
      if (unit_of_bucket[bucket] >= 0) bucket_of_unit[unit_of_bucket[bucket]] = bucket;
    }
    units_ = std::make_shared<UnitSchedule>(sharded_, std::move(units), std::move(bucket_of_unit));
    units_->register_units();
    // Backward gathers and frees units only in kFull; resident units have nothing to do there.
    if (full) config.units = units_;
  }
  reducer_ = std::make_shared<Reducer>(std::move(trained), std::move(names), plan, comm, std::move(config));
  reducer_->install_hooks();
}

DataParallelCore::~DataParallelCore() = default;

void DataParallelCore::before_forward() {
  const int buffer_root = join_ ? agree_on_active_forward() : 0;
  if (options_.sharding() == Sharding::kFull && !at::GradMode::is_enabled() && reducer_->backward_due()) {
    // Its unit gathers and releases would free units that the due backward still needs.
    throw UsageError(
        "ddp::DistributedDataParallel with Sharding::kFull: a forward without gradients began while the backward "
        "of the training forward before it is still due; run that backward first (or, for a training forward "
        "whose backward never runs, run it under torch::NoGradGuard too)");
  }
  reducer_->prepare_for_forward();
  // What the forward and its backward gather and reduce, for a ddp::Join to repeat. A forward before the units
  // are checked gathers every unit at once, as no later forward does: repeating it would pair no collective.
  if (options_.sharding() == Sharding::kFull) {
    if (units_ == nullptr || units_->checked()) {
      sharded_->begin_recording(join_forward_kind(at::GradMode::is_enabled(), reducer_->sync()));
    } else {
      sharded_->stop_recording();
    }
  }
  // Once in_unit is known to be called for every unit, each unit waits for its own gather.
  if (sharded_) sharded_->gather(/*defer_units=*/units_ && units_->checked());
  if (units_) units_->before_forward();
  if (buffer_sync_ && module_->is_training()) {
    buffer_sync_->broadcast(process_group_->communicator(), buffer_root);
  }
}

void DataParallelCore::after_forward(const std::vector<at::Tensor>& outputs) {
  if (units_) {
    if (outputs.empty() && at::GradMode::is_enabled()) {
      throw UsageError(
          "libddp: with shard_units the module's forward must return its output as a tensor, or a "
          "vector, tuple or pair of them, so that the units it used can be checked; return the tensors "
          "and build other types from them outside the wrapped module");
    }
    // The first time the graph can be seen, whether every unit it uses ran through in_unit.
    std::vector<std::uint8_t> used;
    const bool check = !units_->checked() && at::GradMode::is_enabled();
    if (check) used = reducer_->used_by(outputs);
    units_->after_forward(check ? &used : nullptr);
  }
  if (at::GradMode::is_enabled()) reducer_->prepare_for_backward(outputs);
}

void DataParallelCore::broadcast_optimizer_state(torch::optim::Optimizer& optimizer, int root) {
  const OptimizerKind kind = kind_of(optimizer);
  if (auto* capturable = dynamic_cast<optim::CapturableOptimizer*>(&optimizer)) capturable->sync_host_state();
  Communicator& comm = process_group_->communicator();
  const std::vector<std::string> names = state_tensor_names(kind, optimizer);
  // Root's step counts first, in one broadcast (-1: no state yet).
  std::vector<ParamState> states;
  std::vector<std::int64_t> steps;
  for (const at::Tensor& parameter : trained_) {
    states.push_back(read_param_state(kind, optimizer, parameter));
    steps.push_back(states.back().step);
  }
  at::Tensor agreed = at::tensor(steps, at::kLong).to(comm.device());
  comm.broadcast(agreed, root)->wait();
  agreed = agreed.cpu();
  // Then each parameter's state tensors, a parameter at a time (a flat copy
  // of the whole state would add its size to the peak).
  for (std::size_t i = 0; i < trained_.size(); ++i) {
    ParamState& state = states[i];
    state.step = agreed.data_ptr<std::int64_t>()[i];
    if (state.step < 0) {
      if (comm.rank() != root) erase_param_state(optimizer, trained_[i]);
      continue;
    }
    std::vector<at::Tensor> tensors;
    for (const std::string& name : names) {
      at::Tensor& tensor = state.tensors[name];
      if (comm.rank() != root || !tensor.defined()) tensor = at::zeros_like(trained_[i]);
      tensors.push_back(tensor);
    }
    broadcast_coalesced(comm, tensors, root);
    if (comm.rank() != root) write_param_state(kind, optimizer, trained_[i], state);
  }
}

void DataParallelCore::set_sync(bool sync) { reducer_->set_sync(sync); }
bool DataParallelCore::sync() const { return reducer_->sync(); }
std::vector<std::size_t> DataParallelCore::bucket_bytes() const { return reducer_->bucket_bytes(); }
std::vector<IterationTiming> DataParallelCore::timings() const {
  return timeline_ ? timeline_->timings() : std::vector<IterationTiming>{};
}

std::vector<at::Tensor> DataParallelCore::parameters() const {
  return sharded_ ? sharded_->local_parameters() : trained_;
}

std::vector<at::Tensor> DataParallelCore::local_parameters(const std::vector<at::Tensor>& module_parameters) const {
  return sharded_ ? sharded_->local_parameters(module_parameters) : module_parameters;
}

void DataParallelCore::gather_parameters() {
  if (!sharded_) return;
  sharded_->stop_recording();  // not part of an iteration
  sharded_->gather_for_caller();
  if (units_) units_->gather_all();
}

MemoryReport DataParallelCore::memory_report(const torch::optim::Optimizer* optimizer) const {
  MemoryReport report;
  report.sharding = options_.sharding();
  report.world_size = process_group_->world_size();
  std::unordered_set<const c10::TensorImpl*> trained;
  for (const at::Tensor& parameter : trained_) {
    trained.insert(parameter.unsafeGetTensorImpl());
    report.trained_elements += parameter.numel();
  }
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const at::Tensor& parameter : module_->parameters()) {
    const c10::TensorImpl* key = parameter.unsafeGetTensorImpl();
    if (!seen.insert(key).second || (sharded_ && trained.count(key) != 0)) continue;
    report.parameter_bytes += bytes_of(parameter);  // whole on every rank
  }
  if (sharded_) {
    report.parameter_bytes += sharded_->buffer_bytes();
    report.gradient_bytes = sharded_->gradient_shard_bytes() + reducer_->allocated_bucket_bytes();
    if (!sharded_->has_gradient_shards()) {
      for (const at::Tensor& parameter : trained_) report.gradient_bytes += bytes_of(parameter);  // the module's own
      report.gradient_bytes += sharded_->converted_gradient_bytes();
    }
    report.optimizer_elements = sharded_->local_elements();
    report.padding_elements = sharded_->padding_elements();
    report.peak_gathered_bytes = sharded_->peak_gathered_bytes();
  } else {
    for (const at::Tensor& parameter : trained_) report.gradient_bytes += bytes_of(parameter);
    report.optimizer_elements = report.trained_elements;
  }
  if (optimizer != nullptr) report.optimizer_state_bytes = state_bytes(*optimizer);
  return report;
}

void DataParallelCore::save_module(torch::serialize::OutputArchive& archive) {
  if (!sharded_) {
    if (process_group_->rank() == 0) module_->save(archive);
    return;
  }
  save_module_state(*module_, trained_, *sharded_, process_group_->rank(), archive);
}

void DataParallelCore::load_module(torch::serialize::InputArchive& archive) {
  load_module_state(*module_, trained_, sharded_.get(), archive);
}

void DataParallelCore::save_optimizer_state(const torch::optim::Optimizer& optimizer,
                                            torch::serialize::OutputArchive& archive) {
  detail::save_optimizer_state(optimizer, trained_, trained_names_, sharded_.get(), process_group_->communicator(),
                               archive);
}

void DataParallelCore::load_optimizer_state(torch::optim::Optimizer& optimizer,
                                            torch::serialize::InputArchive& archive) {
  detail::load_optimizer_state(optimizer, trained_, trained_names_, sharded_.get(), archive);
}

void DataParallelCore::save_sharded_checkpoint(const std::string& directory, const torch::optim::Optimizer* optimizer,
                                               const std::function<void(torch::serialize::OutputArchive&)>& extra) {
  detail::save_sharded_checkpoint({*module_, trained_, trained_names_, sharded_.get(), to_string(options_.sharding())},
                                  *process_group_, optimizer, directory, extra);
}

void DataParallelCore::load_sharded_checkpoint(const std::string& directory, torch::optim::Optimizer* optimizer,
                                               const std::function<void(torch::serialize::InputArchive&)>& extra) {
  detail::load_sharded_checkpoint({*module_, trained_, trained_names_, sharded_.get(), to_string(options_.sharding())},
                                  *process_group_, optimizer, directory, extra);
}

at::Tensor DataParallelCore::clip_grad_norm_(double max_norm, double norm_type) {
  if (!(max_norm > 0) || !(norm_type > 0)) {
    throw UsageError(fmt::format("libddp: clip_grad_norm_ needs a positive max_norm and norm_type, got {} and {}",
                                 max_norm, norm_type));
  }
  c10::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const at::Tensor& parameter : parameters()) {
    if (parameter.grad().defined()) grads.push_back(parameter.grad());
  }
  const bool infinite = std::isinf(norm_type);
  const auto options = at::TensorOptions().dtype(at::kFloat).device(process_group_->device());
  std::vector<at::Tensor> norms;
  for (const at::Tensor& grad : grads) norms.push_back(grad.norm(norm_type).to(at::kFloat).reshape({1}));
  at::Tensor total;
  if (sharded_) {
    // Each rank holds disjoint parts of the gradients: the p-th powers add
    // up (maxima max up) across ranks. A rank with no part joins with zero.
    at::Tensor local = norms.empty() ? at::zeros({1}, options)
                       : infinite   ? at::cat(norms).max().reshape({1})
                                    : at::cat(norms).pow(norm_type).sum().reshape({1});
    process_group_->communicator().all_reduce(local, infinite ? ReduceOp::kMax : ReduceOp::kSum)->wait_stream();
    total = infinite ? local : local.pow(1.0 / norm_type);
  } else {
    total = norms.empty() ? at::zeros({1}, options) : at::cat(norms).norm(norm_type).reshape({1});
  }
  total = total.reshape({});
  // As torch::nn::utils::clip_grad_norm_: the 1e-6 keeps a zero norm finite;
  // the clamp leaves gradients already within the bound unchanged, with no
  // host sync to decide it.
  const at::Tensor scale = (max_norm / (total + 1e-6)).clamp_max(1.0);
  for (at::Tensor& grad : grads) grad.mul_(scale.to(grad.scalar_type()));
  return total;
}

}  // namespace ddp::detail
