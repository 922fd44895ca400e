#include <fmt/format.h>

#include <ATen/ATen.h>

#include <ddp/errors.h>
#include <ddp/optim.h>

#include <torch/optim/optimizer.h>

#include "compat/torch_compat.h"
#include "cuda/stream_capture.h"
#include "optim/fused_step.h"

namespace ddp::optim {

CapturableOptimizer::~CapturableOptimizer() = default;

void CapturableOptimizer::set_capturable(bool capturable) {
  if (!capturable) {
    capture_ = nullptr;
    return;
  }
  if (!DDP_TORCH_AT_LEAST(2, 2)) {
    throw UsageError(
        fmt::format("ddp::optim: a capturable step needs LibTorch 2.2 or newer (fused kernels that read "
                    "the learning rate from a tensor); this is {}.{}",
                    TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR));
  }
  if (!fused()) {
    throw UsageError(
        "ddp::optim: a capturable step runs the fused kernels, which need every parameter on a CUDA "
        "device with a dense gradient; move the model to the GPU first");
  }
  capture_ = std::make_shared<detail::CaptureState>();
}

void CapturableOptimizer::step_unless_found_inf(const at::Tensor& found_inf) {
  if (ddp::detail::current_stream_capturing()) {
    fused_step(found_inf);
    return;
  }
  if (found_inf.item<float>() == 0.0f) dynamic_cast<torch::optim::Optimizer&>(*this).step();
}

bool CapturableOptimizer::recording_step(const char* optimizer) const {
  const bool capturing = ddp::detail::current_stream_capturing();
  TORCH_CHECK(!capturing || capture_, optimizer, ": a step recorded into a CUDA graph needs set_capturable(true)");
  return capturing;
}

namespace detail {

const at::Tensor& DeviceLearningRates::get(std::size_t group, c10::DeviceIndex device, double lr) {
  at::Tensor& rate = rates_[{group, device}];
  const bool capturing = ddp::detail::current_stream_capturing();
  if (!rate.defined()) {
    // Made before any capture: the eager steps before it (warm-up) make it.
    TORCH_CHECK(!capturing, "DeviceLearningRates: the first step of a group must run eagerly, not captured");
    rate = at::empty({}, at::TensorOptions().device(at::Device(at::kCUDA, device)).dtype(at::kFloat));
  }
  if (!capturing) rate.fill_(lr);
  return rate;
}

void DeviceLearningRates::refresh(const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  for (auto& [where, rate] : rates_) rate.fill_(groups.at(where.first).options().get_lr());
}

}  // namespace detail
}  // namespace ddp::optim
