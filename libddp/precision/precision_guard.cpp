#include <ddp/precision.h>

#include <ATen/Context.h>

#include "compat/torch_compat.h"

namespace ddp {

void set_process_tf32(const PrecisionPolicy& policy) {
  at::globalContext().setAllowTF32CuBLAS(policy.allow_tf32());
  at::globalContext().setAllowTF32CuDNN(policy.allow_tf32());
}

PrecisionGuard::PrecisionGuard(const PrecisionPolicy& policy, c10::Device device) : device_type_(device.type()) {
  auto& context = at::globalContext();
  previous_tf32_cublas_ = context.allowTF32CuBLAS();
  previous_tf32_cudnn_ = context.allowTF32CuDNN();
  context.setAllowTF32CuBLAS(policy.allow_tf32());
  context.setAllowTF32CuDNN(policy.allow_tf32());

  previous_autocast_enabled_ = compat::autocast_enabled(device_type_);
  previous_autocast_dtype_ = compat::autocast_dtype(device_type_);
  if (const auto dtype = policy.autocast_dtype()) {
    compat::set_autocast_enabled(device_type_, true);
    compat::set_autocast_dtype(device_type_, *dtype);
    at::autocast::increment_nesting();
    autocast_entered_ = true;
  } else {
    // A guard for fp32 or tf32 inside an autocast region really means fp32.
    compat::set_autocast_enabled(device_type_, false);
  }
}

PrecisionGuard::~PrecisionGuard() {
  // The cast weights autocast caches are valid only inside the outermost
  // region: the optimizer changes the weights after it.
  if (autocast_entered_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::set_autocast_enabled(device_type_, previous_autocast_enabled_);
  compat::set_autocast_dtype(device_type_, previous_autocast_dtype_);
  auto& context = at::globalContext();
  context.setAllowTF32CuBLAS(previous_tf32_cublas_);
  context.setAllowTF32CuDNN(previous_tf32_cudnn_);
}

}  // namespace ddp
