#pragma once

// What the fused optimizers (FusedAdamW, FusedSGD) share around their kernels.

#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/StringUtil.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>

#include "compat/torch_compat.h"

namespace ddp::detail {
class WeightCastTarget;
}  // namespace ddp::detail

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

/// Capturable mode's device copies (CapturableOptimizer): the learning rates
/// and, for AdamW, the step counts of each kernel call in one tensor, which
/// eager steps set from the host's counts and a recorded step advances
/// itself.
struct CaptureState {
  /// The parameters of one recorded kernel call and their step counts.
  struct RecordedCounts {
    std::vector<at::Tensor> params;
    at::Tensor steps;
  };
  DeviceLearningRates learning_rates;
  std::map<std::tuple<std::size_t, c10::DeviceIndex, c10::ScalarType>, at::Tensor> steps;
  // AdamW: the counts the recorded step advances, and whether replays have
  // advanced them since the host last read them.
  std::vector<RecordedCounts> recorded;
  bool host_counts_stale = false;
  /// The weights whose casts recorded steps write (optim/weight_casts.h),
  /// each once, refreshed before each replay.
  std::vector<std::pair<at::Tensor, std::shared_ptr<ddp::detail::WeightCastTarget>>> recorded_casts;
};

/// Whether `states` holds an entry for every parameter of `group` that has a gradient.
template <typename StateMap>
bool has_state_for_every_gradient(const torch::optim::OptimizerParamGroup& group, const StateMap& states) {
  for (const auto& param : group.params()) {
    if (param.grad().defined() && states.count(state_key<StateMap>(param)) == 0) return false;
  }
  return true;
}

/// Calls `run`, a fused kernel call, with group `group`'s learning rate on
/// `device`: the number `lr`, or in capturable mode (`capture` set) its
/// device tensor, which a recorded step reads at every replay.
template <typename Run>
void run_with_learning_rate([[maybe_unused]] CaptureState* capture, [[maybe_unused]] std::size_t group,
                            [[maybe_unused]] c10::DeviceIndex device, double lr, const Run& run) {
#if DDP_TORCH_AT_LEAST(2, 2)
  if (capture != nullptr) {
    run(capture->learning_rates.get(group, device, lr));
    return;
  }
#endif
  run(lr);
}

/// The one-element tensor the fused kernels skip on, or none.
inline std::optional<at::Tensor> skip_flag(const at::Tensor& found_inf) {
  return found_inf.defined() ? std::optional<at::Tensor>(found_inf) : std::nullopt;
}

/// The loss of `closure`, evaluated with gradients on; undefined without one.
inline at::Tensor evaluate(const torch::optim::Optimizer::LossClosure& closure) {
  if (closure == nullptr) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

}  // namespace ddp::optim::detail
