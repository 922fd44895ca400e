#include <ddp/grad_scaler.h>

#include <cmath>
#include <algorithm>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <ddp/errors.h>
#include <ddp/optim.h>

#include "compat/torch_compat.h"
#include "cuda/stream_capture.h"

namespace ddp {
namespace {

/// Where the fused ATen kernels exist: always on CUDA, on the CPU only in
/// newer LibTorch.
bool has_fused_amp_kernels(const c10::Device& device) { return device.is_cuda() || DDP_TORCH_HAS_CPU_AMP_KERNELS; }

/// found_inf becomes 1 when any gradient holds inf/NaN; every gradient is
/// multiplied by inv_scale. Same contract as _amp_foreach_non_finite_check_and_unscale_.
void unscale_grads(std::vector<at::Tensor>& grads, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  if (has_fused_amp_kernels(found_inf.device())) {
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
    return;
  }
  for (auto& grad : grads) {
    found_inf.add_(at::logical_not(at::isfinite(grad)).any().to(at::kFloat));
    grad.mul_(inv_scale.to(grad.scalar_type()));
  }
  found_inf.clamp_max_(1.0);
}

/// Same contract as _amp_update_scale_.
void update_scale(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                  const GradScalerOptions& options) {
  if (has_fused_amp_kernels(scale.device())) {
    at::_amp_update_scale_(scale, growth_tracker, found_inf, options.growth_factor(), options.backoff_factor(),
                           options.growth_interval());
    return;
  }
  double value = scale.item<double>();
  std::int64_t tracker = growth_tracker.item<std::int64_t>();
  if (found_inf.item<float>() != 0.0f) {
    value *= options.backoff_factor();
    tracker = 0;
  } else if (++tracker == options.growth_interval()) {
    const double grown = value * options.growth_factor();
    if (std::isfinite(static_cast<float>(grown))) value = grown;
    tracker = 0;
  }
  scale.fill_(value);
  growth_tracker.fill_(tracker);
}

void check_options(const GradScalerOptions& options) {
  if (!(options.init_scale() > 0) || !std::isfinite(options.init_scale())) {
    throw UsageError(fmt::format("GradScaler: init_scale must be a positive finite number, got {}", options.init_scale()));
  }
  if (!(options.growth_factor() > 1.0)) {
    throw UsageError(fmt::format("GradScaler: growth_factor must be > 1, got {}", options.growth_factor()));
  }
  if (!(options.backoff_factor() > 0.0 && options.backoff_factor() < 1.0)) {
    throw UsageError(fmt::format("GradScaler: backoff_factor must be in (0, 1), got {}", options.backoff_factor()));
  }
  if (options.growth_interval() < 1) {
    throw UsageError(fmt::format("GradScaler: growth_interval must be >= 1, got {}", options.growth_interval()));
  }
}

}  // namespace

struct GradScaler::Impl {
  /// What this iteration did with one optimizer.
  struct OptimizerStage {
    bool unscaled = false;
    bool stepped = false;
    at::Tensor found_inf;  // agreed across ranks: > 0 when any rank saw inf/NaN
  };

  GradScalerOptions options;
  std::shared_ptr<ProcessGroup> process_group;
  // Created on the loss's device by the first scale(); until then the host
  // values stand for them (fresh scaler, or a state loaded before the first step).
  at::Tensor scale;
  at::Tensor growth_tracker;
  double initial_scale;
  std::int64_t initial_growth_tracker = 0;
  std::unordered_map<const torch::optim::Optimizer*, OptimizerStage> stages;
  // Optimizers stepped before the last update(): a rank out of batches
  // (shadow_step) makes as many found-inf agreements as the others make.
  std::size_t optimizers_per_step = 1;

  /// Creates the scale on `device` from the initial values, where this rank has none yet.
  void ensure_scale(const c10::Device& device) {
    if (scale.defined()) return;
    const auto options = at::TensorOptions().device(device);
    scale = at::full({1}, initial_scale, options.dtype(at::kFloat));
    growth_tracker = at::full({1}, initial_growth_tracker, options.dtype(at::kInt));
  }

  void require_scale(const char* caller) const {
    if (!scale.defined()) {
      throw UsageError(fmt::format(
          "GradScaler::{}: scale() was never called; call scaler.scale(loss).backward() before {}", caller, caller));
    }
  }

  /// Max-reduces found_inf so that every rank takes the same decision.
  void agree_across_ranks(at::Tensor& found_inf) const {
    if (!process_group || process_group->world_size() == 1) return;
    Communicator& communicator = process_group->communicator();
    at::Tensor shared = found_inf.to(communicator.device());
    communicator.all_reduce(shared, ReduceOp::kMax)->wait_stream();
    found_inf = shared.to(found_inf.device());
  }
};

GradScaler::GradScaler(GradScalerOptions options, std::shared_ptr<ProcessGroup> process_group)
    : impl_(std::make_unique<Impl>()) {
  check_options(options);
  impl_->options = options;
  impl_->process_group = std::move(process_group);
  impl_->initial_scale = options.init_scale();
}

GradScaler GradScaler::for_policy(const PrecisionPolicy& policy, std::shared_ptr<ProcessGroup> process_group) {
  return GradScaler(GradScalerOptions().enabled(policy.needs_grad_scaler()), std::move(process_group));
}

GradScaler::~GradScaler() = default;
GradScaler::GradScaler(GradScaler&&) noexcept = default;
GradScaler& GradScaler::operator=(GradScaler&&) noexcept = default;

bool GradScaler::is_enabled() const { return impl_->options.enabled(); }

at::Tensor GradScaler::scale(const at::Tensor& loss) {
  if (!is_enabled()) return loss;
  impl_->ensure_scale(loss.device());
  return loss * impl_->scale.to(loss.device());
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!is_enabled()) return;
  impl_->require_scale("unscale_");
  auto& stage = impl_->stages[&optimizer];
  if (stage.unscaled)
    throw UsageError("GradScaler::unscale_() was already called on this optimizer since the last update()");
  if (stage.stepped) throw UsageError("GradScaler::unscale_() called after step(); unscale before stepping");

  // The reciprocal is taken in double: 1/scale is exact for powers of two,
  // and for the others this is what torch.amp does.
  const at::Tensor inv_scale = impl_->scale.to(at::kDouble).reciprocal().to(at::kFloat);
  // Few devices (usually one): a vector of pairs keeps their first-seen order.
  std::vector<std::pair<c10::Device, std::vector<at::Tensor>>> grads_by_device;
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) {
      const at::Tensor& grad = param.grad();
      if (!grad.defined()) continue;
      if (grad.is_sparse()) throw UsageError("GradScaler: sparse gradients are not supported");
      if (grad.scalar_type() == at::kHalf) {
        throw UsageError("GradScaler: a parameter has fp16 gradients; keep parameters in fp32 and let autocast "
                         "run the forward in fp16");
      }
      auto same_device = [&grad](const auto& entry) { return entry.first == grad.device(); };
      auto entry = std::find_if(grads_by_device.begin(), grads_by_device.end(), same_device);
      if (entry == grads_by_device.end()) entry = grads_by_device.insert(entry, {grad.device(), {}});
      entry->second.push_back(grad);
    }
  }
  at::Tensor found_inf = at::zeros({1}, impl_->scale.options().dtype(at::kFloat));
  for (auto& [device, grads] : grads_by_device) {
    at::Tensor found_here = at::zeros({1}, at::TensorOptions().device(device).dtype(at::kFloat));
    unscale_grads(grads, found_here, inv_scale.to(device));
    found_inf.add_(found_here.to(found_inf.device()));
  }
  // One per device that found inf/NaN: the fused optimizers skip on exactly 1.
  found_inf.clamp_max_(1.0);
  impl_->agree_across_ranks(found_inf);
  stage.unscaled = true;
  stage.found_inf = found_inf;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!is_enabled()) {
    optimizer.step();
    return true;
  }
  auto& stage = impl_->stages[&optimizer];
  if (stage.stepped)
    throw UsageError("GradScaler::step() was already called on this optimizer since the last update()");
  if (!stage.unscaled) unscale_(optimizer);
  stage.stepped = true;
  // Recorded into a CUDA graph, the decision stays on the device: the fused
  // kernels skip the step themselves (what torch.amp does for optimizers
  // that take found_inf).
  auto* capturable = dynamic_cast<optim::CapturableOptimizer*>(&optimizer);
  if (capturable != nullptr && detail::current_stream_capturing()) {
    capturable->step_unless_found_inf(stage.found_inf);
    return true;
  }
  // Otherwise the one host synchronisation of a step, as in torch.amp:
  // whether to step is a host decision.
  const bool skip = stage.found_inf.item<float>() != 0.0f;
  if (!skip) optimizer.step();
  return !skip;
}

void GradScaler::update() {
  if (!is_enabled()) return;
  impl_->require_scale("update");
  if (impl_->stages.empty()) {
    throw UsageError("GradScaler::update(): no step() or unscale_() since the last update(); nothing to update from");
  }
  at::Tensor found_inf = at::zeros_like(impl_->scale);
  for (const auto& [optimizer, stage] : impl_->stages) {
    if (stage.found_inf.defined()) found_inf.add_(stage.found_inf);
  }
  update_scale(impl_->scale, impl_->growth_tracker, found_inf, impl_->options);
  impl_->optimizers_per_step = impl_->stages.size();
  impl_->stages.clear();
}

void GradScaler::shadow_step() {
  if (!is_enabled() || !impl_->process_group) return;
  impl_->ensure_scale(impl_->process_group->device());  // a rank that had no batch at all has none yet
  const std::size_t optimizers = impl_->optimizers_per_step;
  at::Tensor found_inf = at::zeros({1}, impl_->scale.options());
  for (std::size_t i = 0; i < optimizers; ++i) {  // the active ranks agree once per optimizer they step
    at::Tensor agreed = at::zeros({1}, impl_->scale.options());
    impl_->agree_across_ranks(agreed);
    found_inf.add_(agreed);
  }
  impl_->stages[nullptr].found_inf = found_inf;
  update();
  impl_->optimizers_per_step = optimizers;
}

void GradScaler::update(double new_scale) {
  if (!is_enabled()) return;
  if (!(new_scale > 0) || !std::isfinite(new_scale)) {
    throw UsageError(fmt::format("GradScaler::update: the new scale must be a positive finite number, got {}", new_scale));
  }
  if (impl_->scale.defined()) {
    impl_->scale.fill_(new_scale);
  } else {
    impl_->initial_scale = new_scale;
  }
  impl_->stages.clear();
}

double GradScaler::get_scale() const {
  if (!is_enabled()) return 1.0;
  return impl_->scale.defined() ? impl_->scale.item<double>() : impl_->initial_scale;
}

GradScalerState GradScaler::state_dict() const {
  GradScalerState state;
  state.scale = get_scale();
  state.growth_tracker = impl_->growth_tracker.defined() ? impl_->growth_tracker.item<std::int64_t>()
                                                         : impl_->initial_growth_tracker;
  state.growth_factor = impl_->options.growth_factor();
  state.backoff_factor = impl_->options.backoff_factor();
  state.growth_interval = impl_->options.growth_interval();
  return state;
}

void GradScaler::load_state_dict(const GradScalerState& state) {
  GradScalerOptions options = impl_->options;
  options.init_scale(state.scale)
      .growth_factor(state.growth_factor)
      .backoff_factor(state.backoff_factor)
      .growth_interval(state.growth_interval);
  check_options(options);
  if (state.growth_tracker < 0 || state.growth_tracker >= state.growth_interval) {
    throw UsageError(fmt::format("GradScaler state: growth_tracker {} is outside [0, growth_interval {})",
                                 state.growth_tracker, state.growth_interval));
  }
  impl_->options = options;
  impl_->initial_scale = state.scale;
  impl_->initial_growth_tracker = state.growth_tracker;
  if (impl_->scale.defined()) {
    impl_->scale.fill_(state.scale);
    impl_->growth_tracker.fill_(state.growth_tracker);
  }
  impl_->stages.clear();
}

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  const GradScalerState state = state_dict();
  archive.write("scale", c10::IValue(state.scale));
  archive.write("growth_tracker", c10::IValue(state.growth_tracker));
  archive.write("growth_factor", c10::IValue(state.growth_factor));
  archive.write("backoff_factor", c10::IValue(state.backoff_factor));
  archive.write("growth_interval", c10::IValue(state.growth_interval));
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  const auto read = [&archive](const char* key) {
    c10::IValue value;
    if (!archive.try_read(key, value)) {
      throw UsageError(fmt::format("GradScaler checkpoint has no '{}': it was not written by GradScaler::save, or "
                                   "it is corrupt",
                                   key));
    }
    return value;
  };
  GradScalerState state;
  state.scale = read("scale").toDouble();
  state.growth_tracker = read("growth_tracker").toInt();
  state.growth_factor = read("growth_factor").toDouble();
  state.backoff_factor = read("backoff_factor").toDouble();
  state.growth_interval = read("growth_interval").toInt();
  load_state_dict(state);
}

}  // namespace ddp
