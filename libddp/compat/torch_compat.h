#pragma once

// Every difference between the LibTorch versions libddp builds against
// (Debian's 1.13 and PyPI's 2.x) lives here, so the rest of the code reads the
// same on both.

#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>

#define DDP_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// float8 dtypes (at::kFloat8_e4m3fn, at::kFloat8_e5m2) arrived in LibTorch 2.1.
#define DDP_TORCH_HAS_FLOAT8 DDP_TORCH_AT_LEAST(2, 1)

namespace ddp::compat {

/// Owning pointer to a parameter's AccumulateGrad node: std::shared_ptr in
/// LibTorch 1.x, c10::intrusive_ptr in newer releases.
using GradAccumulatorPtr =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::autograd::Variable&>()));

}  // namespace ddp::compat
