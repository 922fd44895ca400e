#pragma once

#include <memory>

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <ddp/export.h>

namespace ddp::optim {

namespace detail {
struct CaptureState;
}  // namespace detail

/// An optimizer whose step ddp::CapturedStep can record in a CUDA graph.
/// Recorded once and replayed, a step would repeat the learning rate and the
/// step count it was recorded with. In capturable mode the step reads both
/// from tensors on the device instead: the graph advances the counts itself,
/// and prepare_replay() copies each group's learning rate from its options
/// before every replay, so a schedule that sets the options' lr each step
/// works as it does eagerly. After replays the device holds the true step
/// counts (a replay that a GradScaler skipped counts none); sync_host_state()
/// brings them back into the optimizer's state, as checkpoints and eager
/// steps do before reading it.
class DDP_API CapturableOptimizer {
 public:
  virtual ~CapturableOptimizer();
  /// Whether the next step() takes the fused path, the only one that can be
  /// recorded.
  virtual bool fused() const = 0;
  /// Turns capturable mode on or off. On, throws UsageError where the step
  /// cannot run on the device alone: parameters off the GPU, or a LibTorch
  /// older than 2.2 (no fused kernels that read the learning rate from a
  /// tensor).
  void set_capturable(bool capturable);
  /// Whether capturable mode is on.
  bool capturable() const { return capture_ != nullptr; }
  /// Before each replay of a recorded step: the learning rates to the device.
  virtual void prepare_replay() = 0;
  /// One step, skipped where `found_inf` (one fp32 element on the
  /// parameters' device) is nonzero: how ddp::GradScaler steps. Inside a
  /// recording the fused kernels read it on the device, with no wait for the
  /// GPU; run eagerly, the step reads it on the host first.
  void step_unless_found_inf(const at::Tensor& found_inf);
  /// Whether every parameter with a gradient has its optimizer state (a
  /// step created it): a recorded step must not create state, since a
  /// replay would create it again every time. ddp::CapturedStep warms up
  /// until this holds (a GradScaler may skip the first steps).
  virtual bool has_state_for_every_gradient() const = 0;
  /// Copies the step counts that replays advanced on the device into the
  /// optimizer's state (one wait for the GPU; nothing without replays since
  /// the last call). libddp's checkpoints call it; call it before reading
  /// state() yourself.
  virtual void sync_host_state() const {}

 protected:
  /// The fused step, skipped on the device where `found_inf` (if defined) is nonzero.
  virtual void fused_step(const at::Tensor& found_inf) = 0;
  /// Whether the step now running is recorded into a CUDA graph; an error
  /// naming `optimizer` if it is but capturable mode is off (the graph would
  /// freeze the learning rate).
  bool recording_step(const char* optimizer) const;

  std::shared_ptr<detail::CaptureState> capture_;  ///< The device copies; null unless capturable.
};

/// torch::optim::AdamW whose step runs ATen's fused multi-tensor kernel
/// (`_fused_adamw_`, what `torch.optim.AdamW(fused=True)` runs) for CUDA
/// parameters, where the LibTorch version has it: one pass over parameters,
/// gradients and moments instead of a dozen kernels per parameter. Elsewhere
/// (CPU parameters, amsgrad, LibTorch 1.x) it is AdamW's own step. Options,
/// state and checkpoints are AdamW's, so either loads the other's.
class DDP_API FusedAdamW : public torch::optim::AdamW, public CapturableOptimizer {
 public:
  using torch::optim::AdamW::AdamW;
  /// One AdamW step, fused where fused() says so. Returns the closure's loss.
  torch::Tensor step(LossClosure closure = nullptr) override;
  bool fused() const override;
  void prepare_replay() override;
  bool has_state_for_every_gradient() const override;
  void sync_host_state() const override;

 private:
  void fused_step(const at::Tensor& found_inf) override;
};

/// torch::optim::SGD whose step runs ATen's fused multi-tensor kernel
/// (`_fused_sgd_`, what `torch.optim.SGD(fused=True)` runs) for CUDA
/// parameters, where the LibTorch version has it: one launch per device and
/// dtype instead of several kernels per parameter, which matters for models of
/// many small tensors such as ResNet-50. Elsewhere (CPU parameters, sparse
/// gradients, LibTorch 1.x) it is SGD's own step. Options, state and
/// checkpoints are SGD's, so either loads the other's.
class DDP_API FusedSGD : public torch::optim::SGD, public CapturableOptimizer {
 public:
  using torch::optim::SGD::SGD;
  /// One SGD step, fused where fused() says so. Returns the closure's loss.
  torch::Tensor step(LossClosure closure = nullptr) override;
  bool fused() const override;
  void prepare_replay() override;
  bool has_state_for_every_gradient() const override;

 private:
  void fused_step(const at::Tensor& found_inf) override;
};

}  // namespace ddp::optim
