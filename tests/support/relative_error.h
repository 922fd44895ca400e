#pragma once

// The accuracy measure of the GPU tests that compare a result with a reference.

#include <ATen/ATen.h>

namespace ddp::testing {

/// ||a - b|| / ||b||, in fp64.
inline double relative_error(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor a64 = a.to(at::kDouble);
  const at::Tensor b64 = b.to(at::kDouble);
  return ((a64 - b64).norm() / b64.norm()).item<double>();
}

}  // namespace ddp::testing
