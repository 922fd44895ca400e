#pragma once

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <ddp/export.h>
#include <ddp/precision.h>
#include <ddp/process_group.h>

namespace torch {
namespace optim {
class Optimizer;
}
namespace serialize {
class InputArchive;
class OutputArchive;
}  // namespace serialize
}  // namespace torch

namespace ddp {

/// Options of GradScaler; the defaults are torch.amp.GradScaler's.
struct GradScalerOptions {
  /// The first scale.
  TORCH_ARG(double, init_scale) = 65536.0;
  /// The scale is multiplied by this after growth_interval steps without inf/NaN.
  TORCH_ARG(double, growth_factor) = 2.0;
  /// The scale is multiplied by this when a step finds inf/NaN.
  TORCH_ARG(double, backoff_factor) = 0.5;
  /// Consecutive steps without inf/NaN before the scale grows.
  TORCH_ARG(std::int64_t, growth_interval) = 2000;
  /// Disabled, every method passes through: scale() returns the loss, step()
  /// steps the optimizer.
  TORCH_ARG(bool, enabled) = true;
};

/// What a GradScaler saves in a checkpoint.
struct GradScalerState {
  /// The current scale.
  double scale = 65536.0;
  std::int64_t growth_tracker = 0;  ///< Clean steps since the scale last changed.
  /// GradScalerOptions::growth_factor.
  double growth_factor = 2.0;
  /// GradScalerOptions::backoff_factor.
  double backoff_factor = 0.5;
  /// GradScalerOptions::growth_interval.
  std::int64_t growth_interval = 2000;
};

/// Dynamic loss scaling for fp16 training, as torch.amp.GradScaler:
///
///   ddp::GradScaler scaler(ddp::GradScalerOptions(), process_group);
///   scaler.scale(loss).backward();
///   scaler.unscale_(optimizer);              // optional, e.g. before clipping
///   scaler.step(optimizer);                  // skipped on inf/NaN
///   scaler.update();
///
/// With a process group, whether a step found inf/NaN is agreed across ranks
/// (a max all-reduce), so every rank skips the same steps and the replicas
/// never diverge. Gradients must not be reduced in place after unscale_().
class DDP_API GradScaler {
 public:
  /// Throws UsageError for invalid options (a non-positive init_scale,
  /// growth_factor <= 1, backoff_factor outside (0, 1), growth_interval < 1).
  /// Without `process_group` the inf/NaN check is this process's alone.
  explicit GradScaler(GradScalerOptions options = {}, std::shared_ptr<ProcessGroup> process_group = nullptr);
  /// Enabled exactly when the policy needs loss scaling (fp16).
  static GradScaler for_policy(const PrecisionPolicy& policy, std::shared_ptr<ProcessGroup> process_group = nullptr);
  ~GradScaler();
  /// Movable, not copyable.
  GradScaler(GradScaler&&) noexcept;
  /// Movable, not copyable.
  GradScaler& operator=(GradScaler&&) noexcept;

  /// GradScalerOptions::enabled.
  bool is_enabled() const;
  /// loss * scale, in fp32 on the loss's device.
  at::Tensor scale(const at::Tensor& loss);
  /// Divides the optimizer's gradients by the scale in place and records
  /// whether any is inf/NaN. At most once per optimizer between update()s.
  void unscale_(torch::optim::Optimizer& optimizer);
  /// Unscales if not done yet, then steps the optimizer unless some rank
  /// found inf/NaN. Returns whether the optimizer stepped. Recorded into a
  /// CUDA graph (ddp::CapturedStep) with a capturable optimizer, the
  /// decision stays on the device (the fused kernels skip the step, no host
  /// wait) and this returns true: the optimizer was asked to step.
  bool step(torch::optim::Optimizer& optimizer);
  /// Backs the scale off if this iteration's steps found inf/NaN, grows it
  /// after growth_interval clean iterations. Call once per iteration, after step().
  void update();
  /// A rank out of batches under ddp::Join stands in for step() and update():
  /// it takes part in the found-inf agreement as a rank that found none and
  /// updates its scale with the agreed result, so it keeps the others' scale.
  /// ddp::Join calls it (JoinOptions::grad_scaler).
  void shadow_step();
  /// Sets the scale to `new_scale` instead.
  void update(double new_scale);

  /// The current scale (1 when disabled, as torch.amp.GradScaler's get_scale()).
  double get_scale() const;
  /// The state to checkpoint.
  GradScalerState state_dict() const;
  /// Restores a state_dict(); UsageError for invalid values.
  void load_state_dict(const GradScalerState& state);
  /// Writes state_dict() into `archive`.
  void save(torch::serialize::OutputArchive& archive) const;
  /// Reads what save() wrote; UsageError naming a missing entry.
  void load(torch::serialize::InputArchive& archive);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp
