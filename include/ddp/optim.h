#pragma once

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <ddp/export.h>

namespace ddp::optim {

/// torch::optim::AdamW whose step runs ATen's fused multi-tensor kernel
/// (`_fused_adamw_`, what `torch.optim.AdamW(fused=True)` runs) for CUDA
/// parameters, where the LibTorch version has it: one pass over parameters,
/// gradients and moments instead of a dozen kernels per parameter. Elsewhere
/// (CPU parameters, amsgrad, LibTorch 1.x) it is AdamW's own step. Options,
/// state and checkpoints are AdamW's, so either loads the other's.
class DDP_API FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  /// One AdamW step, fused where fused() says so. Returns the closure's loss.
  torch::Tensor step(LossClosure closure = nullptr) override;

  /// Whether the next step() takes the fused path.
  bool fused() const;
};

/// torch::optim::SGD whose step runs ATen's fused multi-tensor kernel
/// (`_fused_sgd_`, what `torch.optim.SGD(fused=True)` runs) for CUDA
/// parameters, where the LibTorch version has it: one launch per device and
/// dtype instead of several kernels per parameter, which matters for models of
/// many small tensors such as ResNet-50. Elsewhere (CPU parameters, sparse
/// gradients, LibTorch 1.x) it is SGD's own step. Options, state and
/// checkpoints are SGD's, so either loads the other's.
class DDP_API FusedSGD : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;
  /// One SGD step, fused where fused() says so. Returns the closure's loss.
  torch::Tensor step(LossClosure closure = nullptr) override;
  /// Whether the next step() takes the fused path.
  bool fused() const;
};

}  // namespace ddp::optim
