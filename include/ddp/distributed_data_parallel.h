#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <ddp/export.h>
#include <ddp/comm_hooks.h>
#include <ddp/iteration_timing.h>
#include <ddp/process_group.h>
#include <ddp/sharding.h>

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim
namespace torch::serialize {
class InputArchive;
class OutputArchive;
}  // namespace torch::serialize

namespace ddp {

class Join;
struct JoinOptions;

/// Options of DistributedDataParallel; defaults are PyTorch DDP's, except
/// gradient_as_bucket_view (on here, off in PyTorch).
struct DistributedDataParallelOptions {
  /// Size of a gradient bucket, in MiB.
  TORCH_ARG(double, bucket_cap_mb) = 25;
  /// Size of the first bucket (the last layers' gradients, ready first), in MiB.
  TORCH_ARG(double, first_bucket_cap_mb) = 1;
  /// Gradients are views into their bucket: nothing is copied in or out.
  TORCH_ARG(bool, gradient_as_bucket_view) = true;
  /// Find, after each forward, the parameters the outputs do not depend on
  /// and count them as ready. Needed when not every parameter is used in
  /// every iteration; costs a walk of the autograd graph per iteration.
  TORCH_ARG(bool, find_unused_parameters) = false;
  /// Copy rank 0's buffers (BatchNorm statistics) to every rank before each
  /// forward in training mode.
  TORCH_ARG(bool, broadcast_buffers) = true;
  /// The set of used parameters and the order gradients become ready never
  /// change: unused parameters are found (and agreed across ranks) once, so
  /// a step can be recorded into a CUDA graph, and buckets are rebuilt in
  /// ready order even with find_unused_parameters.
  TORCH_ARG(bool, static_graph) = false;
  /// How buckets are reduced (default: comm_hooks::average()).
  TORCH_ARG(CommHook, comm_hook) = nullptr;
  /// Record each backward's device timeline: when its kernels ran, when
  /// each bucket became ready and when its reduction ran (GPU runs only).
  /// Read it with DistributedDataParallel::timings().
  TORCH_ARG(bool, record_timeline) = false;
  /// Also write it as Chrome-trace JSON (Perfetto, chrome://tracing) when the
  /// DDP object is destroyed. Unset: the DDP_TIMELINE variable, a path
  /// prefix to which each rank appends ".rank<N>.json".
  TORCH_ARG(std::string, timeline_path) = "";
  /// What each rank keeps whole (ZeRO stages; see Sharding). With sharding,
  /// build the optimizer over parameters() instead of the module's, and the
  /// buckets keep their first layout (they are not rebuilt in ready order).
  TORCH_ARG(Sharding, sharding) = Sharding::kNone;
  /// Sharding::kFull: the modules gathered as one unit each, as module-path
  /// patterns where '*' stands for one path segment: {"layers.*"} makes
  /// each transformer block a unit (FSDP's fully_shard on each block). The
  /// model's forward runs each unit through ddp::in_unit. Parameters outside
  /// every unit (embeddings, the last norm) stay gathered. kOptimizer and
  /// kGradients keep every parameter gathered, but units pace the
  /// all-gather of the updated parameters: each unit waits only for its own
  /// at its entry, so the gathers of later layers overlap the forward of
  /// earlier ones (without units the forward waits for all of them first).
  TORCH_ARG(std::vector<std::string>, shard_units) = {};
  /// The sharded modes: the dtype units are gathered and computed in (FSDP's
  /// MixedPrecisionPolicy param_dtype; with kOptimizer and kGradients,
  /// DeepSpeed's bf16 mode), e.g. at::kBFloat16: half the bytes of each
  /// gather and reduction, and autocast finds the weights already in bf16
  /// instead of casting them every step and keeping the copies for backward.
  /// The units' parameters and gradients take this dtype; the shards the
  /// optimizer steps, their gradients and checkpoints keep the parameters'
  /// own (fp32 masters). Gradients are averaged in it unless a comm hook says
  /// otherwise (comm_hooks::average_in(at::kFloat)). Parameters outside units
  /// keep their dtype. Needs shard_units. Unset: the parameters' own.
  TORCH_ARG(std::optional<c10::ScalarType>, param_dtype) = std::nullopt;
};

namespace detail {

class Reducer;
class Timeline;
class BufferSync;
class ShardedParameters;
class UnitSchedule;

/// What ddp::in_unit tells the unit schedule of the model that has `unit`.
class DDP_API UnitScope {
 public:
  /// Gathers the unit's parameters (no-op for a module that is no unit).
  explicit UnitScope(const torch::nn::Module& unit);
  /// After the unit's forward: frees them, and hooks their gathering before
  /// the unit's backward onto `outputs`.
  void leave(const std::vector<at::Tensor>& outputs);

 private:
  std::shared_ptr<UnitSchedule> schedule_;
  std::size_t unit_ = 0;
};

/// The part of DistributedDataParallel that does not depend on the module type.
class DDP_API DataParallelCore {
 public:
  DataParallelCore(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> process_group,
                   const DistributedDataParallelOptions& options);
  ~DataParallelCore();
  void before_forward();
  void after_forward(const std::vector<at::Tensor>& outputs);
  void set_sync(bool sync);
  bool sync() const;
  std::vector<std::size_t> bucket_bytes() const;
  std::vector<IterationTiming> timings() const;
  std::vector<at::Tensor> parameters() const;
  std::vector<at::Tensor> local_parameters(const std::vector<at::Tensor>& module_parameters) const;
  void gather_parameters();
  MemoryReport memory_report(const torch::optim::Optimizer* optimizer) const;
  at::Tensor clip_grad_norm_(double max_norm, double norm_type);
  void save_module(torch::serialize::OutputArchive& archive);
  void load_module(torch::serialize::InputArchive& archive);
  void save_optimizer_state(const torch::optim::Optimizer& optimizer, torch::serialize::OutputArchive& archive);
  void load_optimizer_state(torch::optim::Optimizer& optimizer, torch::serialize::InputArchive& archive);
  void save_sharded_checkpoint(const std::string& directory, const torch::optim::Optimizer* optimizer,
                               const std::function<void(torch::serialize::OutputArchive&)>& extra);
  void load_sharded_checkpoint(const std::string& directory, torch::optim::Optimizer* optimizer,
                               const std::function<void(torch::serialize::InputArchive&)>& extra);
  /// ddp::Join: from here on each forward first agrees with the other ranks
  /// on who is still active. UsageError for what the sharding mode cannot join.
  void enter_join(const JoinOptions& options);
  /// ddp::Join::done(): meets the active ranks' collectives until every rank
  /// is done, then gives every rank the state of the rank that trained
  /// longest, and leaves join mode.
  void shadow_until_all_joined();
  void leave_join();

 private:
  struct JoinState;
  /// Under a Join, an active rank's forward: agrees on who is active and
  /// what this forward does; returns the rank whose buffers are broadcast.
  int agree_on_active_forward();
  /// Under a Join, a rank out of batches meets one forward of the active
  /// ranks and the backward that follows it (`kind`: JoinState's).
  void shadow_iteration(int kind, bool train_buffers, int buffer_root);
  /// The step a rank out of batches runs after a synchronised backward.
  void shadow_step();
  /// Every rank takes `root`'s state of `optimizer` (SGD, Adam, AdamW). Collective.
  void broadcast_optimizer_state(torch::optim::Optimizer& optimizer, int root);
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<ProcessGroup> process_group_;
  DistributedDataParallelOptions options_;
  std::vector<at::Tensor> trained_;  // each trained parameter once (tied ones are one)
  std::vector<std::string> trained_names_;
  std::shared_ptr<ShardedParameters> sharded_;  // null: Sharding::kNone
  std::shared_ptr<UnitSchedule> units_;         // null: not Sharding::kFull
  std::unique_ptr<BufferSync> buffer_sync_;  // null: no buffers
  std::shared_ptr<Timeline> timeline_;
  std::shared_ptr<Reducer> reducer_;
  std::unique_ptr<JoinState> join_;  // set between enter_join() and leave_join()
};

inline void collect_tensors(const at::Tensor& tensor, std::vector<at::Tensor>& out) { out.push_back(tensor); }
inline void collect_tensors(const std::vector<at::Tensor>& tensors, std::vector<at::Tensor>& out) {
  out.insert(out.end(), tensors.begin(), tensors.end());
}
template <typename First, typename Second>
void collect_tensors(const std::pair<First, Second>& pair, std::vector<at::Tensor>& out) {
  collect_tensors(pair.first, out);
  collect_tensors(pair.second, out);
}
template <typename... Ts>
void collect_tensors(const std::tuple<Ts...>& tuple, std::vector<at::Tensor>& out) {
  std::apply([&](const auto&... items) { (collect_tensors(items, out), ...); }, tuple);
}
/// Any other output type holds no tensors DDP can see (find_unused_parameters
/// then reports that it cannot work).
template <typename T>
void collect_tensors(const T&, std::vector<at::Tensor>&) {}

template <typename Impl>
std::shared_ptr<torch::nn::Module> as_module(const torch::nn::ModuleHolder<Impl>& holder) {
  return holder.ptr();
}
template <typename Impl>
std::shared_ptr<torch::nn::Module> as_module(const std::shared_ptr<Impl>& module) {
  return module;
}

}  // namespace detail

/// Data-parallel training of `ModuleType` (a module holder such as
/// torch::nn::Linear or a std::shared_ptr to a torch::nn::Module subclass):
/// calling it calls the module's forward, and backward averages the
/// gradients over all ranks, bucket by bucket, while it still runs.
///
///   auto pg = ddp::init();
///   auto model = ddp::DistributedDataParallel(Net(), pg);
///   auto loss = criterion(model(input), target);
///   loss.backward();        // gradients are averaged across ranks when this returns
///   optimizer.step();
template <typename ModuleType>
class DistributedDataParallel {
 public:
  /// Checks that every rank has the same parameters (names, shapes, dtypes)
  /// and copies rank 0's parameters and buffers to every rank. Collective:
  /// every rank must construct it.
  DistributedDataParallel(ModuleType module, std::shared_ptr<ProcessGroup> process_group,
                          const DistributedDataParallelOptions& options = {})
      : module_(std::move(module)),
        core_(std::make_shared<detail::DataParallelCore>(detail::as_module(module_), std::move(process_group),
                                                         options)) {}

  /// Calls the module's forward with `args` and returns its output. In
  /// training mode it first copies rank 0's buffers (broadcast_buffers); with
  /// grad mode on it then readies the next backward to reduce gradients (and,
  /// with find_unused_parameters, finds the parameters the output does not
  /// depend on).
  template <typename... Args>
  auto forward(Args&&... args) {
    core_->before_forward();
    auto output = module_->forward(std::forward<Args>(args)...);
    std::vector<at::Tensor> tensors;
    detail::collect_tensors(output, tensors);
    core_->after_forward(tensors);
    return output;
  }

  /// Same as forward().
  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  /// The wrapped module (its parameters are the ones being trained).
  ModuleType& module() { return module_; }
  /// The wrapped module.
  const ModuleType& module() const { return module_; }

  /// Parameters with their module paths, e.g. "layer1.0.conv1.weight".
  torch::OrderedDict<std::string, at::Tensor> named_parameters() const { return module_->named_parameters(); }

  /// While alive, backward passes accumulate gradients locally without
  /// reducing them; the first backward after it reduces the sum:
  ///   { auto guard = model.no_sync(); loss(model(a)).backward(); }
  ///   loss(model(b)).backward();  // reduces the gradients of a and b
  class NoSyncGuard {
   public:
    /// Made by no_sync().
    explicit NoSyncGuard(std::shared_ptr<detail::DataParallelCore> core)
        : core_(std::move(core)), previous_(core_->sync()) {
      core_->set_sync(false);
    }
    /// The moved-from guard no longer restores anything.
    NoSyncGuard(NoSyncGuard&& other) noexcept : core_(std::move(other.core_)), previous_(other.previous_) {}
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(NoSyncGuard&&) = delete;
    ~NoSyncGuard() {
      if (core_) core_->set_sync(previous_);
    }

   private:
    std::shared_ptr<detail::DataParallelCore> core_;
    bool previous_;
  };

  /// Turns gradient reduction off until the returned guard is destroyed
  /// (PyTorch's `with model.no_sync():`).
  NoSyncGuard no_sync() { return NoSyncGuard(core_); }

  /// Size of each gradient bucket in bytes, in reduction order (after the
  /// first iteration: as rebuilt in the order gradients became ready).
  std::vector<std::size_t> bucket_bytes() const { return core_->bucket_bytes(); }
  /// Number of gradient buckets.
  std::size_t bucket_count() const { return bucket_bytes().size(); }

  /// The recorded timeline of every reduced backward so far (with
  /// record_timeline or a timeline path; empty otherwise or on CPU backends).
  /// Waits for the device to finish them.
  std::vector<IterationTiming> timings() const { return core_->timings(); }

  /// What the optimizer must step on this rank. Without sharding, the
  /// module's trained parameters. With sharding, this rank's part of each: a
  /// flat tensor aliasing the part of the parameter in this rank's shard (or
  /// a master of that part, where units are gathered in another dtype),
  /// whose gradient, after a reducing backward, is the average over ranks of
  /// that part (parameters with no part here are left out). Elementwise
  /// optimizers (SGD, Adam, AdamW, the fused ones in <ddp/optim.h>) then
  /// train exactly as on the whole parameters; ones that look across elements
  /// (LBFGS, Adafactor) do not.
  ///
  ///   ddp::optim::FusedAdamW optimizer(model.parameters(), options);
  std::vector<at::Tensor> parameters() const { return core_->parameters(); }
  /// parameters() for a subset of the module's parameters, for optimizer
  /// groups (e.g. no weight decay for 1-D parameters): the subset is chosen
  /// on the module's parameters, whose shapes are still known. Tensors that
  /// require no gradient (frozen parameters) are passed through.
  std::vector<at::Tensor> local_parameters(const std::vector<at::Tensor>& module_parameters) const {
    return core_->local_parameters(module_parameters);
  }
  /// With sharding, the optimizer updates only this rank's shards; the next
  /// forward all-gathers the module's parameters first. Call this to have
  /// them whole without a forward, e.g. to read them. With kFull it holds
  /// every unit gathered until the next forward: to save the module, use
  /// save_module(). Collective.
  void gather_parameters() { core_->gather_parameters(); }

  /// What this rank holds of the model: parameters, gradients and, given the
  /// optimizer that steps parameters(), its state.
  MemoryReport memory_report(const torch::optim::Optimizer* optimizer = nullptr) const {
    return core_->memory_report(optimizer);
  }

  /// Writes the module into `archive` as Module::save does (load it with
  /// module()->load, in any mode and at any world size). With sharding the
  /// parameters are gathered from the shards one bucket at a time and copied
  /// to rank 0's host memory, so no device holds the whole model (with
  /// kFull, the module's own unit parameters hold no memory between
  /// iterations). Collective; the archive is filled on rank 0, which saves
  /// it (checkpoint::save_on_rank0).
  void save_module(torch::serialize::OutputArchive& archive) { core_->save_module(archive); }
  /// Loads what save_module() (or Module::save) wrote into the module, in
  /// any mode and at any world size, in place: every tensor keeps its device
  /// and its autograd hooks (Module::load moves a parameter to the archive's
  /// device, which drops the hooks DDP installed on it). Sharded parameters
  /// go into this rank's shards; the next forward gathers them. Strict, as
  /// PyTorch's load_state_dict: UsageError naming a tensor or module that the
  /// archive or the model lacks, or that it holds in another shape or dtype.
  /// Float8Linear layers get back their delayed-scaling state (amax histories
  /// and scales), which save_module() and the sharded checkpoint keep too.
  void load_module(torch::serialize::InputArchive& archive) { core_->load_module(archive); }

  /// Writes into `archive` the state of `optimizer` (built over
  /// parameters()) for the whole model, as one process holds it: per trained
  /// parameter, by name, its step and its state tensors in the parameter's
  /// shape. With sharding, every rank's part is gathered, one bucket at a
  /// time, so no device holds the whole state. The same in every mode, so a
  /// checkpoint loads in any sharding mode and at any world size. Collective;
  /// the archive is filled on rank 0, which saves it
  /// (checkpoint::save_on_rank0). SGD, Adam and AdamW (and the fused ones).
  void save_optimizer_state(const torch::optim::Optimizer& optimizer, torch::serialize::OutputArchive& archive) {
    core_->save_optimizer_state(optimizer, archive);
  }
  /// Loads what save_optimizer_state() wrote, in any mode and at any world
  /// size, into `optimizer` (built over parameters()): each rank takes the
  /// part it steps. UsageError naming the mismatch for another model's or
  /// optimizer's state. Load the module with load_module().
  void load_optimizer_state(torch::optim::Optimizer& optimizer, torch::serialize::InputArchive& archive) {
    core_->load_optimizer_state(optimizer, archive);
  }

  /// Writes a sharded checkpoint into `directory` (FSDP's sharded state dict
  /// through torch.distributed.checkpoint): every rank writes one file with
  /// the parts of the parameters and of `optimizer`'s state (built over
  /// parameters(); null: none) that it steps, in parallel, so that no rank
  /// ever holds more than its own share; rank 0 then writes a manifest with
  /// the layout, the buffers and frozen parameters, and what `extra`
  /// (called on rank 0) adds: the run's step, data position, scaler. Every
  /// file is written atomically and the manifest commits the checkpoint, so
  /// `directory` always holds a whole one; files of the previous checkpoint
  /// are removed afterwards. `directory` must be one every rank sees (a
  /// shared filesystem). Collective. Unlike save_module(), rank 0's host
  /// needs no room for the whole model.
  void save_sharded_checkpoint(const std::string& directory, const torch::optim::Optimizer* optimizer = nullptr,
                               const std::function<void(torch::serialize::OutputArchive&)>& extra = nullptr) {
    core_->save_sharded_checkpoint(directory, optimizer, extra);
  }
  /// Loads what save_sharded_checkpoint() wrote, in any sharding mode and at
  /// any world size (each rank reads only the files that hold parts of what
  /// it steps), into the module and `optimizer` (built over parameters();
  /// null: the model only). `extra` reads, on every rank, what it wrote, and
  /// must run no collective. UsageError naming the difference for a
  /// checkpoint of another model or optimizer, or a missing, truncated or
  /// foreign file; a failure on any rank is an error on every rank.
  /// Collective.
  void load_sharded_checkpoint(const std::string& directory, torch::optim::Optimizer* optimizer = nullptr,
                               const std::function<void(torch::serialize::InputArchive&)>& extra = nullptr) {
    core_->load_sharded_checkpoint(directory, optimizer, extra);
  }

 private:
  ModuleType module_;
  std::shared_ptr<detail::DataParallelCore> core_;

  template <typename M>
  friend at::Tensor clip_grad_norm_(DistributedDataParallel<M>& model, double max_norm, double norm_type);
  friend class Join;
};

/// Runs `function`, the forward of `unit` (a submodule of a model wrapped
/// with Sharding::kFull that shard_units names), with the unit's parameters
/// gathered: they are all-gathered before (the next unit's gather overlaps
/// this one's compute), freed after, and gathered again before the unit's
/// backward. With kOptimizer/kGradients it first waits for the gather of
/// the unit's updated parameters that the forward started. For any other
/// module, or without sharding, it just runs `function`, so one model
/// serves every mode:
///
///   for (auto& block : blocks) h = ddp::in_unit(*block, [&] { return block->forward(h); });
///
/// Every rank must run the same units in the same order. The outputs
/// (a tensor, or a vector, tuple or pair of them) carry the hooks of the
/// backward gather; the unit's parameters must not be used outside it.
template <typename Function>
auto in_unit(const torch::nn::Module& unit, Function&& function) {
  detail::UnitScope scope(unit);
  auto output = std::forward<Function>(function)();
  std::vector<at::Tensor> tensors;
  detail::collect_tensors(output, tensors);
  scope.leave(tensors);
  return output;
}

/// Scales the gradients of model.parameters() so that their norm over the
/// whole model, across ranks, is at most `max_norm`, as
/// torch::nn::utils::clip_grad_norm_ in one process; with sharding each rank
/// holds part of the gradients, so the norm is reduced across ranks
/// (collective: every rank must call it). Returns the norm before clipping,
/// as a tensor on the device (reading it waits for the device). `norm_type`:
/// p of the p-norm, or infinity.
template <typename ModuleType>
at::Tensor clip_grad_norm_(DistributedDataParallel<ModuleType>& model, double max_norm, double norm_type = 2.0) {
  return model.core_->clip_grad_norm_(max_norm, norm_type);
}

}  // namespace ddp
