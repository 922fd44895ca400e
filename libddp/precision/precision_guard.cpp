#include <ddp/precision.h>

#include <ATen/Context.h>

#include "compat/torch_compat.h"

namespace ddp {
namespace {

void set_tf32(bool allow) {
  auto& context = at::globalContext();
  context.setAllowTF32CuBLAS(allow);
  context.setAllowTF32CuDNN(allow);
}

/// The autocast state a policy asks for: on with its dtype, or, for fp32 and
/// tf32, off (a guard for those inside an autocast region really means fp32).
/// Refuses fp16 and fp8 off CUDA first (a cheap check there; DDP checks CUDA
/// devices once), before any state changes.
AutocastState autocast_for(const PrecisionPolicy& policy, c10::Device device) {
  if (!device.is_cuda()) policy.check_supported(device);
  if (const auto dtype = policy.autocast_dtype()) return {true, *dtype};
  return {false, AutocastState::current(device.type()).dtype};
}

}  // namespace

void set_process_tf32(const PrecisionPolicy& policy) { set_tf32(policy.allow_tf32()); }

AutocastState AutocastState::current(c10::DeviceType device_type) {
  return {compat::autocast_enabled(device_type), compat::autocast_dtype(device_type)};
}

AutocastStateGuard::AutocastStateGuard(c10::DeviceType device_type, const AutocastState& state)
    : device_type_(device_type), previous_(AutocastState::current(device_type)), entered_(state.enabled) {
  // The dtype first: ATen may refuse it, and then nothing has changed.
  compat::set_autocast_dtype(device_type_, state.dtype);
  compat::set_autocast_enabled(device_type_, state.enabled);
  if (entered_) at::autocast::increment_nesting();
}

AutocastStateGuard::~AutocastStateGuard() {
  // The cast weights autocast caches are valid only inside the outermost
  // region: the optimizer changes the weights after it.
  if (entered_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::set_autocast_enabled(device_type_, previous_.enabled);
  compat::set_autocast_dtype(device_type_, previous_.dtype);
}

PrecisionGuard::PrecisionGuard(const PrecisionPolicy& policy, c10::Device device)
    : previous_tf32_cublas_(at::globalContext().allowTF32CuBLAS()),
      previous_tf32_cudnn_(at::globalContext().allowTF32CuDNN()),
      autocast_(device.type(), autocast_for(policy, device)) {
  set_tf32(policy.allow_tf32());
}

PrecisionGuard::~PrecisionGuard() {
  auto& context = at::globalContext();
  context.setAllowTF32CuBLAS(previous_tf32_cublas_);
  context.setAllowTF32CuDNN(previous_tf32_cudnn_);
}

}  // namespace ddp
