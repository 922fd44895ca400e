#include <ddp/optim.h>

#include <map>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>

#include "compat/torch_compat.h"
#include "optim/fused_step.h"

namespace ddp::optim {

bool FusedSGD::fused() const {
#if DDP_TORCH_HAS_FUSED_SGD
  return detail::cuda_and_dense(param_groups_);
#else
  return false;
#endif
}

void FusedSGD::prepare_replay() {
  if (capture_) capture_->learning_rates.refresh(param_groups_);
}

bool FusedSGD::has_state_for_every_gradient() const {
  // Only momentum keeps state.
  for (const auto& group : param_groups_) {
    if (static_cast<const torch::optim::SGDOptions&>(group.options()).momentum() == 0) continue;
    if (!detail::has_state_for_every_gradient(group, state_)) return false;
  }
  return true;
}

torch::Tensor FusedSGD::step(LossClosure closure) {
  if (!fused()) return torch::optim::SGD::step(std::move(closure));
  const torch::Tensor loss = detail::evaluate(closure);
  fused_step(/*found_inf=*/{});
  return loss;
}

void FusedSGD::fused_step([[maybe_unused]] const at::Tensor& found_inf) {
#if DDP_TORCH_HAS_FUSED_SGD
  torch::NoGradGuard no_grad;
  const bool capturing = recording_step("ddp::optim::FusedSGD");
  for (std::size_t group_index = 0; group_index < param_groups_.size(); ++group_index) {
    auto& group = param_groups_[group_index];
    const auto& options = static_cast<const torch::optim::SGDOptions&>(group.options());
    const bool with_momentum = options.momentum() != 0;
    // One call per device and dtype, and apart for parameters whose momentum
    // buffer starts now: the kernel then sets it to the gradient, as SGD does.
    struct Lists {
      std::vector<at::Tensor> params, grads, momentum_buffers;
    };
    std::map<std::tuple<c10::DeviceIndex, c10::ScalarType, bool>, Lists> lists;
    for (auto& param : group.params()) {
      if (!param.grad().defined()) continue;
      bool first_step = false;
      at::Tensor buffer;
      if (with_momentum) {
        auto& slot = state_[detail::state_key<decltype(state_)>(param)];
        if (!slot) {
          TORCH_CHECK(!capturing,
                      "ddp::optim::FusedSGD: a recorded step would start a momentum buffer (every replay would "
                      "start it anew); step every parameter eagerly first");
          auto state = std::make_unique<torch::optim::SGDParamState>();
          state->momentum_buffer(at::empty_like(param, at::MemoryFormat::Preserve));
          slot = std::move(state);
          first_step = true;
        }
        buffer = static_cast<torch::optim::SGDParamState&>(*slot).momentum_buffer();
      }
      Lists& list = lists[{param.device().index(), param.scalar_type(), first_step}];
      list.params.push_back(param);
      list.grads.push_back(param.grad());
      if (with_momentum) list.momentum_buffers.push_back(buffer);
    }
    for (auto& [where, list] : lists) {
      // The learning rate as a number, or (capturable) as a device tensor.
      // Structured bindings are captured by name: C++17 lambdas cannot capture them.
      const auto run = [&, &list = list, first_step = std::get<2>(where)](const auto& lr) {
        at::_fused_sgd_(list.params, list.grads, list.momentum_buffers, options.weight_decay(), options.momentum(), lr,
                        options.dampening(), options.nesterov(), /*maximize=*/false, /*is_first_step=*/first_step,
                        /*grad_scale=*/std::nullopt, detail::skip_flag(found_inf));
      };
      detail::run_with_learning_rate(capture_.get(), group_index, std::get<0>(where), options.lr(), run);
    }
  }
#endif
}

}  // namespace ddp::optim
