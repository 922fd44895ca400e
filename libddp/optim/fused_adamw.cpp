#include <ddp/optim.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "compat/torch_compat.h"
#include "optim/fused_step.h"
#ifdef DDP_WITH_CUDA_KERNELS
#include "cuda/alignment.h"
#include "optim/adamw_segments.h"
#include "optim/weight_casts.h"
#endif

namespace ddp::optim {
namespace {

/// The tensors of one fused kernel call: one device and dtype.
struct Lists {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  std::vector<double> steps;
};

#ifdef DDP_WITH_CUDA_KERNELS
/// Whether libddp's own AdamW kernel takes `list`: fp32 parameters, fp32
/// gradients and moments, all contiguous (each parameter one run of
/// elements).
bool own_kernel_takes(const Lists& list) {
  for (std::size_t i = 0; i < list.params.size(); ++i) {
    for (const at::Tensor* t : {&list.params[i], &list.grads[i], &list.exp_avgs[i], &list.exp_avg_sqs[i]}) {
      if (t->scalar_type() != at::kFloat || !t->is_contiguous()) return false;
    }
  }
  return true;
}

using WeightCasts = std::vector<std::pair<at::Tensor, std::shared_ptr<ddp::detail::WeightCastTarget>>>;

/// Where the step writes the cast of `param` that a layer asked for
/// (optim/weight_casts.h) into `segment`, and the target into `casts`. A
/// step a found inf skips writes the cast all the same (of the weight as it
/// stays).
void attach_weight_cast(const at::Tensor& param, ddp::detail::AdamWSegment& segment, WeightCasts& casts) {
  std::shared_ptr<ddp::detail::WeightCastTarget> target = ddp::detail::weight_cast_target(param);
  if (!target) return;
  // Asked even where the kernel cannot write the cast: the weight changes,
  // and the target drops the cast it holds of it.
  std::optional<ddp::detail::WeightCast> cast = target->before_update(param);
  if (!cast) return;
  if (cast->float8.data != nullptr) {
    // The FP8 tiles take 16-byte loads of every array.
    for (const void* array :
         {static_cast<const void*>(segment.param), static_cast<const void*>(segment.grad),
          static_cast<const void*>(segment.exp_avg), static_cast<const void*>(segment.exp_avg_sq)}) {
      if (!ddp::detail::aligned(array, 16)) return;
    }
  }
  segment.cast = *cast;
  casts.emplace_back(param, std::move(target));
}

/// libddp's AdamW kernel over `list` (own_kernel_takes), with `steps` the
/// device step counts in the list's order and `lr` a number or, capturable,
/// a 0-dim device tensor; it writes the weight casts layers asked for and
/// adds their weights to `casts`.
template <typename LearningRate>
void own_kernel_step(const Lists& list, const at::Tensor& steps, const LearningRate& lr,
                     const torch::optim::AdamWOptions& options, const at::Tensor& found_inf, WeightCasts& casts) {
  std::vector<ddp::detail::AdamWSegment> segments(list.params.size());
  const std::size_t first_cast = casts.size();
  for (std::size_t i = 0; i < segments.size(); ++i) {
    auto& segment = segments[i];
    segment.param = list.params[i].data_ptr<float>();
    segment.exp_avg = list.exp_avgs[i].data_ptr<float>();
    segment.exp_avg_sq = list.exp_avg_sqs[i].data_ptr<float>();
    segment.grad = list.grads[i].data_ptr<float>();
    segment.step = steps.data_ptr<float>() + i;
    segment.numel = list.params[i].numel();
    attach_weight_cast(list.params[i], segment, casts);
  }
  ddp::detail::AdamWHyper hyper;
  if constexpr (std::is_same_v<LearningRate, double>) {
    hyper.lr_value = static_cast<float>(lr);
  } else {
    hyper.lr = lr.template data_ptr<float>();
  }
  hyper.beta1 = static_cast<float>(std::get<0>(options.betas()));
  hyper.beta2 = static_cast<float>(std::get<1>(options.betas()));
  hyper.weight_decay = static_cast<float>(options.weight_decay());
  hyper.eps = static_cast<float>(options.eps());
  hyper.found_inf = found_inf.defined() ? found_inf.data_ptr<float>() : nullptr;
  ddp::detail::adamw_segments_step(std::move(segments), hyper, list.params.front().device());
  for (std::size_t i = first_cast; i < casts.size(); ++i) casts[i].second->after_update(casts[i].first);
}
#endif

}  // namespace

void FusedAdamW::prepare_replay() {
  if (!capture_) return;
  capture_->learning_rates.refresh(param_groups_);
  capture_->host_counts_stale = !capture_->recorded.empty();
#ifdef DDP_WITH_CUDA_KERNELS
  for (const auto& [weight, target] : capture_->recorded_casts) target->before_replay(weight);
#endif
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

bool FusedAdamW::has_state_for_every_gradient() const {
  for (const auto& group : param_groups_) {
    if (!detail::has_state_for_every_gradient(group, state_)) return false;
  }
  return true;
}

void FusedAdamW::sync_host_state() const {
  if (!capture_ || !capture_->host_counts_stale) return;
  for (const auto& counts : capture_->recorded) {
    const at::Tensor steps = counts.steps.to(at::kCPU);  // waits for the replays
    const float* values = steps.data_ptr<float>();
    for (std::size_t i = 0; i < counts.params.size(); ++i) {
      const auto found = state_.find(detail::state_key<decltype(state_)>(counts.params[i]));
      if (found == state_.end()) continue;  // a checkpoint loaded since dropped it
      static_cast<torch::optim::AdamWParamState&>(*found->second).step(static_cast<int64_t>(values[i]));
    }
  }
  capture_->host_counts_stale = false;
}

torch::Tensor FusedAdamW::step(LossClosure closure) {
  if (!fused()) return torch::optim::AdamW::step(std::move(closure));
  const torch::Tensor loss = detail::evaluate(closure);
  fused_step(/*found_inf=*/{});
  return loss;
}

void FusedAdamW::fused_step([[maybe_unused]] const at::Tensor& found_inf) {
#if DDP_TORCH_HAS_FUSED_ADAMW
  torch::NoGradGuard no_grad;
  // Recorded into a CUDA graph, a step counts on the device only;
  // sync_host_state() reads the counts back.
  const bool capturing = recording_step("ddp::optim::FusedAdamW");
  if (capture_ && !capturing) {
    sync_host_state();
    capture_->recorded.clear();
  }
#ifdef DDP_WITH_CUDA_KERNELS
  WeightCasts casts;  // the weights whose casts this step writes
#endif
  for (std::size_t group_index = 0; group_index < param_groups_.size(); ++group_index) {
    auto& group = param_groups_[group_index];
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    // The kernel takes tensors of one device and dtype per call.
    std::map<std::tuple<c10::DeviceIndex, c10::ScalarType>, Lists> lists;
    for (auto& param : group.params()) {
      if (!param.grad().defined()) continue;
      auto& slot = state_[detail::state_key<decltype(state_)>(param)];
      if (!slot) {
        TORCH_CHECK(!capturing,
                    "ddp::optim::FusedAdamW: a recorded step would create optimizer state (a replay would create it "
                    "again); step every parameter eagerly first");
        auto state = std::make_unique<torch::optim::AdamWParamState>();
        state->step(0);
        state->exp_avg(at::zeros_like(param, at::MemoryFormat::Preserve));
        state->exp_avg_sq(at::zeros_like(param, at::MemoryFormat::Preserve));
        slot = std::move(state);
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*slot);
      // Eagerly the host count is the truth and the kernel reads a copy of
      // it; recorded, the device count advances itself.
      if (!capturing) state.step(state.step() + 1);
      Lists& list = lists[{param.device().index(), param.scalar_type()}];
      list.params.push_back(param);
      list.grads.push_back(param.grad());
      list.exp_avgs.push_back(state.exp_avg());
      list.exp_avg_sqs.push_back(state.exp_avg_sq());
      list.steps.push_back(static_cast<double>(state.step()));
    }
    for (auto& [where, list] : lists) {
      const c10::Device device = list.params.front().device();
      const auto key = std::make_tuple(group_index, device.index(), std::get<1>(where));
      at::Tensor steps;
      if (capturing) {
        // The tensor the eager steps before the capture kept: the graph counts on.
        steps = capture_->steps.at(key);
        TORCH_CHECK(steps.numel() == static_cast<int64_t>(list.params.size()),
                    "ddp::optim::FusedAdamW: the recorded step updates other parameters than the eager step before it");
        steps.add_(1);
        capture_->recorded.push_back({list.params, steps});
      } else {
        // One host-to-device copy for all the steps of this call, from pinned
        // memory and asynchronous: a copy from pageable memory makes the host
        // wait for everything queued before it (the whole backward), and the
        // GPU then idles while the host launches the optimizer's kernels.
        const at::Tensor counts = at::tensor(list.steps, at::kFloat).pin_memory();
        at::Tensor* kept = nullptr;
        if (capture_) {
          const auto found = capture_->steps.find(key);
          if (found != capture_->steps.end() && found->second.numel() == counts.numel()) kept = &found->second;
        }
        if (kept != nullptr) {
          // Into the tensor a recorded step reads, so that its replays count on from here.
          steps = kept->copy_(counts, /*non_blocking=*/true);
        } else {
          steps = counts.to(device, at::kFloat, /*non_blocking=*/true);
          if (capture_) capture_->steps[key] = steps;
        }
      }
      const auto [beta1, beta2] = options.betas();
      // The learning rate as a number, or (capturable) as a device tensor.
      // Structured bindings are captured by name: C++17 lambdas cannot capture them.
      const auto run = [&, &list = list, beta1 = beta1, beta2 = beta2](const auto& lr) {
#ifdef DDP_WITH_CUDA_KERNELS
        if (own_kernel_takes(list)) {
          own_kernel_step(list, steps, lr, options, found_inf, casts);
          return;
        }
#endif
        std::vector<at::Tensor> step_views;
        for (int64_t i = 0; i < steps.numel(); ++i) step_views.push_back(steps[i]);
        at::_fused_adamw_(list.params, list.grads, list.exp_avgs, list.exp_avg_sqs, /*max_exp_avg_sqs=*/{}, step_views,
                          lr, beta1, beta2, options.weight_decay(), options.eps(), /*amsgrad=*/false,
                          /*maximize=*/false, /*grad_scale=*/std::nullopt, detail::skip_flag(found_inf));
      };
      detail::run_with_learning_rate(capture_.get(), group_index, device.index(), options.lr(), run);
      // The kernel leaves a skipped step's parameters and moments alone; its count is taken back.
      if (found_inf.defined()) steps.sub_(found_inf);
    }
  }
#ifdef DDP_WITH_CUDA_KERNELS
  if (capturing) {
    // Kept through eager steps between replays (the graph still reads the
    // casts), and through a recording anew (a cast of a weight that graph
    // does not read is written again harmlessly).
    for (auto& cast : casts) {
      auto& recorded = capture_->recorded_casts;
      const bool known = std::any_of(recorded.begin(), recorded.end(),
                                     [&](const auto& entry) { return entry.first.is_same(cast.first); });
      if (!known) recorded.push_back(std::move(cast));
    }
  }
#endif
#endif
}

}  // namespace ddp::optim
