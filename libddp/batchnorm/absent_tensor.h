#pragma once

// LibTorch 2.x's Function::apply records every tensor argument's device, so
// an absent (undefined) tensor travels through it as an empty one; present
// ones are never empty in the BatchNorm functions, but for a synchronised
// rank's empty batch, whose residual a flag beside it says is there.

#include <ATen/ATen.h>

namespace ddp::detail {

inline at::Tensor or_empty(const at::Tensor& tensor, const at::Tensor& like) {
  return tensor.defined() ? tensor : at::empty({0}, like.options());
}

inline at::Tensor unless_empty(const at::Tensor& tensor) { return tensor.numel() == 0 ? at::Tensor() : tensor; }

}  // namespace ddp::detail
