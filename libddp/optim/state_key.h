#pragma once

#include <string>
#include <type_traits>

#include <ATen/core/Tensor.h>
#include <c10/util/StringUtil.h>

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

}  // namespace ddp::optim::detail
