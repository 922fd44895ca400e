#pragma once

// Every difference between the LibTorch versions libddp builds against
// (Debian's 1.13 and PyPI's 2.x) lives here, so the rest of the code reads the
// same on both.

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>

#define DDP_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// float8 dtypes (at::kFloat8_e4m3fn, at::kFloat8_e5m2) arrived in LibTorch 2.1;
// at::_scaled_mm took its present form (scales as arguments, one Tensor
// returned) in 2.4, which is what Float8Linear calls.
#define DDP_TORCH_HAS_FLOAT8 DDP_TORCH_AT_LEAST(2, 1)
#define DDP_TORCH_HAS_SCALED_MM DDP_TORCH_AT_LEAST(2, 4)
// at::mm with an out_dtype: bf16/fp16 operands, products accumulated and
// written in fp32 (aten::mm.dtype; taken from 2.9, the oldest release checked).
#define DDP_TORCH_HAS_MM_OUT_DTYPE DDP_TORCH_AT_LEAST(2, 9)

// The fused GradScaler kernels have had CUDA implementations since 1.x; CPU
// ones came later. The dispatch header exists exactly when the kernel does.
#if __has_include(<ATen/ops/_amp_foreach_non_finite_check_and_unscale_cpu_dispatch.h>) && \
    __has_include(<ATen/ops/_amp_update_scale_cpu_dispatch.h>)
#define DDP_TORCH_HAS_CPU_AMP_KERNELS 1
#else
#define DDP_TORCH_HAS_CPU_AMP_KERNELS 0
#endif

// The cuDNN the process loaded, next to the one LibTorch was built with
// (LibTorch 2.x; taken from 2.8, the oldest 2.x release libddp is tried with).
#define DDP_TORCH_HAS_RUNTIME_CUDNN_VERSION DDP_TORCH_AT_LEAST(2, 8)

// ATen's fused AdamW kernel (what torch.optim.AdamW(fused=True) runs).
#define DDP_TORCH_HAS_FUSED_ADAMW __has_include(<ATen/ops/_fused_adamw.h>)
// ATen's fused SGD kernel (what torch.optim.SGD(fused=True) runs), since 2.3.
#define DDP_TORCH_HAS_FUSED_SGD __has_include(<ATen/ops/_fused_sgd.h>)

namespace ddp::compat {

/// Owning pointer to a parameter's AccumulateGrad node: std::shared_ptr in
/// LibTorch 1.x, c10::intrusive_ptr in newer releases.
using GradAccumulatorPtr =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::autograd::Variable&>()));

// Autocast state of one device type. LibTorch 2.4 keyed it by device type;
// 1.13 had one function pair per device.
inline bool autocast_enabled(c10::DeviceType device_type) {
#if DDP_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(device_type);
#else
  return device_type == c10::DeviceType::CUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

inline void set_autocast_enabled(c10::DeviceType device_type, bool enabled) {
#if DDP_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(device_type, enabled);
#else
  if (device_type == c10::DeviceType::CUDA) {
    at::autocast::set_enabled(enabled);
  } else {
    at::autocast::set_cpu_enabled(enabled);
  }
#endif
}

inline c10::ScalarType autocast_dtype(c10::DeviceType device_type) {
#if DDP_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(device_type);
#else
  return device_type == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                              : at::autocast::get_autocast_cpu_dtype();
#endif
}

inline void set_autocast_dtype(c10::DeviceType device_type, c10::ScalarType dtype) {
#if DDP_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(device_type, dtype);
#else
  if (device_type == c10::DeviceType::CUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
}

}  // namespace ddp::compat
