#pragma once

// What the fused optimizers (FusedAdamW, FusedSGD) share around their kernels.

#include <cstddef>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/StringUtil.h>
#include <torch/optim/optimizer.h>

namespace ddp::optim::detail {

/// A parameter's key in a torch::optim::Optimizer state map: its TensorImpl,
/// as a string in older LibTorch and as the pointer in newer. Keys made the
/// way torch::optim makes them keep the fused optimizers' state and
/// checkpoints interchangeable with LibTorch's own optimizers.
template <typename StateMap>
typename StateMap::key_type state_key(const at::Tensor& param) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    return c10::str(param.unsafeGetTensorImpl());
  } else {
    return param.unsafeGetTensorImpl();
  }
}

/// Whether the fused kernels can take every parameter: on a CUDA device, with
/// a dense gradient (or none yet).
inline bool cuda_and_dense(const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  for (const auto& group : groups) {
    for (const auto& param : group.params()) {
      if (!param.is_cuda() || (param.grad().defined() && param.grad().is_sparse())) return false;
    }
  }
  return true;
}

/// Throws UsageError unless `optimizer` can run capturable: its fused path
/// (CUDA parameters) on a LibTorch whose fused kernels read the learning rate
/// from a tensor (2.2 and newer).
void check_capturable(const char* optimizer, bool fused);

/// Capturable mode's learning rates: a 0-dim fp32 tensor per param group and
/// device, which the fused kernels read instead of a number baked into a
/// recorded step.
class DeviceLearningRates {
 public:
  /// Group `group`'s tensor on `device`, set to `lr` unless the current
  /// stream is capturing: a recorded step must read the tensor, which
  /// refresh() sets before each replay.
  const at::Tensor& get(std::size_t group, c10::DeviceIndex device, double lr);
  /// Every tensor from its group's current learning rate.
  void refresh(const std::vector<torch::optim::OptimizerParamGroup>& groups);

 private:
  std::map<std::pair<std::size_t, c10::DeviceIndex>, at::Tensor> rates_;
};

/// The loss of `closure`, evaluated with gradients on; undefined without one.
inline at::Tensor evaluate(const torch::optim::Optimizer::LossClosure& closure) {
  if (closure == nullptr) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

}  // namespace ddp::optim::detail
