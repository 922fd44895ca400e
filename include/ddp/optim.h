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
/// works as it does eagerly. Checkpoints keep the host's counts, which
/// prepare_replay() advances too.
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
  /// Before each replay of a recorded step: the learning rates to the
  /// device, and one more step counted on the host.
  virtual void prepare_replay() = 0;

 protected:
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
};

}  // namespace ddp::optim
