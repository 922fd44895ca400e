#include <ddp/optim.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>

#include "compat/torch_compat.h"
#include "cuda/stream_capture.h"
#include "optim/fused_step.h"

namespace ddp::optim {

void FusedAdamW::prepare_replay() {
  if (!capture_) return;
  capture_->learning_rates.refresh(param_groups_);
  for (torch::optim::AdamWParamState* state : capture_->recorded) state->step(state->step() + 1);
}

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
  // Recorded into a CUDA graph, a step counts on the device only; the host
  // counts each replay (prepare_replay).
  const bool capturing = ddp::detail::current_stream_capturing();
  if (capture_ && !capturing) capture_->recorded.clear();
  for (std::size_t group_index = 0; group_index < param_groups_.size(); ++group_index) {
    auto& group = param_groups_[group_index];
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
      if (capturing) {
        TORCH_CHECK(capture_, "ddp::optim::FusedAdamW: a step recorded into a CUDA graph needs set_capturable(true)");
        capture_->recorded.push_back(&state);
      } else {
        state.step(state.step() + 1);
      }
      Lists& list = lists[{param.device().index(), param.scalar_type()}];
      list.params.push_back(param);
      list.grads.push_back(param.grad());
      list.exp_avgs.push_back(state.exp_avg());
      list.exp_avg_sqs.push_back(state.exp_avg_sq());
      list.steps.push_back(static_cast<double>(state.step()));
    }
    for (auto& [where, list] : lists) {
      const c10::Device device = list.params.front().device();
      at::Tensor steps;
      if (capturing) {
        // The tensor the eager steps before the capture kept: the graph counts on.
        steps = capture_->steps.at({group_index, device.index(), std::get<1>(where)});
        TORCH_CHECK(steps.numel() == static_cast<int64_t>(list.params.size()),
                    "ddp::optim::FusedAdamW: the recorded step updates other parameters than the eager step before it");
        steps.add_(1);
      } else {
        // One host-to-device copy for all the steps of this call, from pinned
        // memory and asynchronous: a copy from pageable memory makes the host
        // wait for everything queued before it (the whole backward), and the
        // GPU then idles while the host launches the optimizer's kernels.
        steps = at::tensor(list.steps, at::kFloat).pin_memory().to(device, at::kFloat, /*non_blocking=*/true);
        if (capture_) capture_->steps[{group_index, device.index(), std::get<1>(where)}] = steps;
      }
      std::vector<at::Tensor> step_views;
      for (int64_t i = 0; i < steps.numel(); ++i) step_views.push_back(steps[i]);
      const auto [beta1, beta2] = options.betas();
      // The learning rate as a number, or (capturable) as a device tensor.
      // Structured bindings are captured by name: C++17 lambdas cannot capture them.
      const auto run = [&, &list = list, beta1 = beta1, beta2 = beta2](const auto& lr) {
        at::_fused_adamw_(list.params, list.grads, list.exp_avgs, list.exp_avg_sqs, /*max_exp_avg_sqs=*/{}, step_views,
                          lr, beta1, beta2, options.weight_decay(), options.eps(), /*amsgrad=*/false,
                          /*maximize=*/false);
      };
#if DDP_TORCH_AT_LEAST(2, 2)
      if (capture_) {
        run(capture_->learning_rates.get(group_index, device.index(), options.lr()));
        continue;
      }
#endif
      run(options.lr());
    }
  }
  return loss;
#else
  return {};
#endif
}

}  // namespace ddp::optim
