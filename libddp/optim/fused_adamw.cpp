#include <ddp/optim.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>

#include "compat/torch_compat.h"
#include "optim/fused_step.h"

namespace ddp::optim {

bool FusedAdamW::fused() const {
#if DDP_TORCH_HAS_FUSED_ADAMW
  for (const auto& group : param_groups_) {
    if (static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad()) return false;
  }
  return detail::cuda_and_dense(param_groups_);
#else
  return false;
#endif
}

torch::Tensor FusedAdamW::step(LossClosure closure) {
  if (!fused()) return torch::optim::AdamW::step(std::move(closure));
#if DDP_TORCH_HAS_FUSED_ADAMW
  const torch::Tensor loss = detail::evaluate(closure);
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    // The kernel takes tensors of one device and dtype per call.
    struct Lists {
      std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
      std::vector<double> steps;
    };
    std::map<std::tuple<c10::DeviceIndex, c10::ScalarType>, Lists> lists;
    for (auto& param : group.params()) {
      if (!param.grad().defined()) continue;
      auto& slot = state_[detail::state_key<decltype(state_)>(param)];
      if (!slot) {
        auto state = std::make_unique<torch::optim::AdamWParamState>();
        state->step(0);
        state->exp_avg(at::zeros_like(param, at::MemoryFormat::Preserve));
        state->exp_avg_sq(at::zeros_like(param, at::MemoryFormat::Preserve));
        slot = std::move(state);
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*slot);
      // The host count stays the truth (it is what checkpoints hold); the
      // kernel reads its own copy of the incremented step.
      state.step(state.step() + 1);
      Lists& list = lists[{param.device().index(), param.scalar_type()}];
      list.params.push_back(param);
      list.grads.push_back(param.grad());
      list.exp_avgs.push_back(state.exp_avg());
      list.exp_avg_sqs.push_back(state.exp_avg_sq());
      list.steps.push_back(static_cast<double>(state.step()));
    }
    for (auto& [where, list] : lists) {
      // One host-to-device copy for all the steps of this call, from pinned
      // memory and asynchronous: a copy from pageable memory makes the host
      // wait for everything queued before it (the whole backward), and the GPU
      // then idles while the host launches the optimizer's kernels.
      const at::Tensor steps = at::tensor(list.steps, at::kFloat)
                                   .pin_memory()
                                   .to(list.params.front().device(), at::kFloat, /*non_blocking=*/true);
      std::vector<at::Tensor> step_views;
      for (int64_t i = 0; i < steps.numel(); ++i) step_views.push_back(steps[i]);
      const auto [beta1, beta2] = options.betas();
      at::_fused_adamw_(list.params, list.grads, list.exp_avgs, list.exp_avg_sqs, /*max_exp_avg_sqs=*/{}, step_views,
                        options.lr(), beta1, beta2, options.weight_decay(), options.eps(), /*amsgrad=*/false,
                        /*maximize=*/false);
    }
  }
  return loss;
#else
  return {};
#endif
}

}  // namespace ddp::optim
