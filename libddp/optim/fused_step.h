#pragma once

// What the fused optimizers (FusedAdamW, FusedSGD) share around their kernels.

#include <string>
#include <type_traits>
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

/// The loss of `closure`, evaluated with gradients on; undefined without one.
inline at::Tensor evaluate(const torch::optim::Optimizer::LossClosure& closure) {
  if (closure == nullptr) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

}  // namespace ddp::optim::detail
