// The FP8 cast of a Float8Linear's weight, or its bf16 copy, that FusedAdamW
// writes as it updates the weight (float8/weight_cast.h): the forward reads
// it, and training with it gives, bit for bit, what training gives when each
// forward casts the weight itself and ATen's fused AdamW steps the weights
// (which writes no cast), eager and recorded into a CUDA graph, with several
// micro-batches, evaluation forwards, and weights changed between a step and
// the next forward (a checkpoint loaded).

#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "float8/linear_state.h"
#include "float8/scaling.h"

namespace {

const torch::Device kGpu(torch::kCUDA, 0);
constexpr double kLr = 1e-2;
using Access = ddp::detail::Float8LinearAccess;

/// Two layers whose shapes leave partial tiles of the step's 64 x 64 tiles,
/// in FP8 with delayed scaling (the optimizer writes FP8 casts) or in bf16
/// autocast with FP8 off (bf16 copies).
struct Model {
  bool float8;
  ddp::Float8Linear first{nullptr}, second{nullptr};
  std::vector<torch::Tensor> parameters;

  explicit Model(bool float8) : float8(float8) {
    torch::manual_seed(5);
    const auto recipe = ddp::Float8Options().scaling(ddp::Float8Scaling::kDelayed).amax_history_len(4).enabled(float8);
    first = ddp::Float8Linear(torch::nn::LinearOptions(96, 80).bias(false), recipe);
    second = ddp::Float8Linear(torch::nn::LinearOptions(80, 272).bias(false), recipe);
    first->to(kGpu);
    second->to(kGpu);
    parameters = {first->weight, second->weight};
  }

  torch::Tensor loss(const torch::Tensor& input) {
    torch::Tensor output;
    if (float8) {
      output = second(first(input));
    } else {
      ddp::PrecisionGuard guard(ddp::PrecisionPolicy::parse("bf16"), kGpu);
      output = second(first(input));
    }
    return output.to(torch::kFloat).square().mean();
  }

  /// The layers' FP8 state; none in bf16.
  std::vector<ddp::detail::Float8LinearState*> states() {
    if (!float8) return {};
    return {Access::state(*first), Access::state(*second)};
  }

  /// The iteration's commit, as float8::all_reduce_amaxes makes it on one rank.
  void commit_amaxes() {
    std::vector<ddp::detail::TensorScaling*> scalings;
    for (auto* state : states()) {
      for (auto* scaling : state->scalings()) scalings.push_back(scaling);
    }
    ddp::detail::TensorScaling::commit_pending_amaxes(scalings);
  }
};

std::string mode(bool float8) { return float8 ? "fp8" : "bf16"; }

torch::Tensor batch(int step) {
  torch::manual_seed(100 + step);
  return torch::randn({32, 96}, torch::TensorOptions().device(kGpu).dtype(torch::kBFloat16)) * (step + 1);
}

/// ATen's fused AdamW over a model's weights, which FusedAdamW's own kernel
/// equals bit for bit (FusedAdamW.EqualsAtensFusedKernelBitForBit) and which
/// asks no layer for a cast: the weights' versions advance, and each forward
/// casts them itself.
struct ReferenceAdamW {
  std::vector<torch::Tensor> params, exp_avgs, exp_avg_sqs, steps;

  explicit ReferenceAdamW(const std::vector<torch::Tensor>& parameters) : params(parameters) {
    for (const auto& p : params) {
      exp_avgs.push_back(torch::zeros_like(p));
      exp_avg_sqs.push_back(torch::zeros_like(p));
      steps.push_back(torch::zeros({}, p.options()));
    }
  }
  void zero_grad(bool set_to_none) {
    for (auto& p : params) {
      if (set_to_none) {
        p.mutable_grad() = torch::Tensor();
      } else if (p.grad().defined()) {
        p.mutable_grad().zero_();
      }
    }
  }
  void step() {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> grads;
    for (const auto& p : params) grads.push_back(p.grad());
    for (auto& count : steps) count.add_(1);
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, {}, steps, kLr, 0.9, 0.999, 0.01, 1e-8, false, false,
                      std::nullopt, std::nullopt);
  }
};

void expect_same_state(Model& written, Model& cast, const std::string& at) {
  for (std::size_t i = 0; i < written.parameters.size(); ++i) {
    EXPECT_TRUE(torch::equal(written.parameters[i], cast.parameters[i])) << at << ": weight " << i;
  }
  const auto written_states = written.states();
  const auto cast_states = cast.states();
  for (std::size_t layer = 0; layer < written_states.size(); ++layer) {
    const auto a = written_states[layer]->scalings();
    const auto b = cast_states[layer]->scalings();
    for (std::size_t role = 0; role < a.size(); ++role) {
      EXPECT_TRUE(torch::equal(a[role]->amax_history(), b[role]->amax_history()))
          << at << ": layer " << layer << " role " << role << " history";
      EXPECT_TRUE(torch::equal(a[role]->scale(), b[role]->scale()))
          << at << ": layer " << layer << " role " << role << " scale";
    }
  }
}

/// Scales the weights in place, as a checkpoint load writes them.
void load_other_weights(Model& model) {
  torch::NoGradGuard no_grad;
  for (auto& weight : model.parameters) weight.mul_(0.75);
}

std::vector<torch::Tensor> micro_batches(int step) { return {batch(2 * step), batch(2 * step + 1)}; }

/// One training step of `model`: a micro-batch each of `inputs` (which
/// require their gradients, so that the first layer's backward reads its
/// weight's transposed cast), the iteration's commit after each backward,
/// then `step`.
template <typename Optimizer>
torch::Tensor train_step(Model& model, Optimizer& optimizer, const std::vector<torch::Tensor>& inputs) {
  // In place: a recorded step keeps its gradients where it recorded them.
  optimizer.zero_grad(/*set_to_none=*/false);
  torch::Tensor total = torch::zeros({}, torch::TensorOptions().device(kGpu));
  for (const torch::Tensor& input : inputs) {
    const torch::Tensor loss = model.loss(input.detach().requires_grad_());
    loss.backward();
    model.commit_amaxes();
    total = total + loss.detach();
  }
  optimizer.step();
  return total;
}

TEST(Float8WeightCast, TheForwardReadsTheCastTheStepWrote) {
  for (const bool float8 : {true, false}) {
    Model model(float8);
    ddp::optim::FusedAdamW optimizer(model.parameters, torch::optim::AdamWOptions(kLr));
    ASSERT_TRUE(optimizer.fused());
    train_step(model, optimizer, micro_batches(0));  // the forwards ask for casts
    train_step(model, optimizer, micro_batches(1));  // which this step writes
    for (auto* state : model.states()) ASSERT_TRUE(state->weight.weight_cast_offered());
    {
      // Zeros written past the version counter: a forward that cast the
      // weights itself would give zero.
      torch::NoGradGuard no_grad;
      for (auto& weight : model.parameters) weight.data().zero_();
    }
    EXPECT_GT(model.loss(batch(0)).item<float>(), 0.0f)
        << mode(float8) << ": the forward did not read the casts the step wrote";
    for (auto* state : model.states()) EXPECT_FALSE(state->weight.weight_cast_offered()) << "taken";
  }
}

TEST(Float8WeightCast, TrainingWithTheCastsEqualsTrainingWithout) {
  for (const bool float8 : {true, false}) {
    Model written(float8);
    Model reference(float8);
    ddp::optim::FusedAdamW written_optimizer(written.parameters, torch::optim::AdamWOptions(kLr));
    ReferenceAdamW reference_optimizer(reference.parameters);
    ASSERT_TRUE(written_optimizer.fused());
    for (int step = 0; step < 6; ++step) {
      const std::string at = mode(float8) + ", step " + std::to_string(step);
      if (step == 4) {
        load_other_weights(written);
        load_other_weights(reference);
      } else if (step >= 1) {
        for (auto* state : written.states()) EXPECT_TRUE(state->weight.weight_cast_offered()) << at;
      }
      if (step == 2) {
        // An evaluation forward takes the casts, as it would have cast.
        torch::NoGradGuard no_grad;
        EXPECT_TRUE(torch::equal(written.loss(batch(50)), reference.loss(batch(50)))) << at << ": evaluation";
      }
      const torch::Tensor written_loss = train_step(written, written_optimizer, micro_batches(step));
      const torch::Tensor reference_loss = train_step(reference, reference_optimizer, micro_batches(step));
      EXPECT_TRUE(torch::equal(written_loss, reference_loss))
          << at << ": loss " << written_loss.item<float>() << " against " << reference_loss.item<float>();
      expect_same_state(written, reference, at);
    }
  }
}

/// A recorded step's forward reads the cast the replay before it wrote; a
/// weight loaded between two replays is cast again before the next.
TEST(Float8WeightCast, ARecordedStepCastsAWeightLoadedBetweenReplaysAgain) {
  for (const bool float8 : {true, false}) {
    Model recorded(float8);
    Model reference(float8);
    ddp::optim::FusedAdamW recorded_optimizer(recorded.parameters, torch::optim::AdamWOptions(kLr));
    ReferenceAdamW reference_optimizer(reference.parameters);
    ddp::CapturedStep captured(
        recorded_optimizer,
        [&](const std::vector<torch::Tensor>& inputs) { return train_step(recorded, recorded_optimizer, inputs); },
        ddp::CapturedStepOptions().warmup_steps(1));
    for (int step = 0; step < 7; ++step) {
      const std::string at = mode(float8) + ", step " + std::to_string(step);
      if (step == 4) {
        ASSERT_TRUE(captured.captured());
        load_other_weights(recorded);
        load_other_weights(reference);
      }
      const torch::Tensor recorded_loss = captured(micro_batches(step));
      const torch::Tensor reference_loss = train_step(reference, reference_optimizer, micro_batches(step));
      EXPECT_TRUE(torch::equal(recorded_loss, reference_loss))
          << at << ": loss " << recorded_loss.item<float>() << " against " << reference_loss.item<float>();
      expect_same_state(recorded, reference, at);
    }
  }
}

}  // namespace
