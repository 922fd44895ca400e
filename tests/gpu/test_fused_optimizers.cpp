// The fused optimizers on a GPU take the fused kernels and match LibTorch's
// own optimizers (FusedAdamW AdamW, FusedSGD SGD), each reads the other's
// checkpoints, and a step never makes the host wait for the device.

#include <sstream>

#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/Sleep.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/optim.h>

namespace {

std::vector<torch::Tensor> make_parameters() {
  torch::manual_seed(0);
  std::vector<torch::Tensor> params;
  for (auto shape : std::vector<std::vector<int64_t>>{{64, 32}, {32}, {7, 3, 3, 3}, {1}}) {
    params.push_back(torch::randn(shape, torch::kCUDA).requires_grad_());
  }
  return params;
}

void set_gradients(std::vector<torch::Tensor>& params, int step) {
  torch::manual_seed(100 + step);
  for (auto& p : params) p.mutable_grad() = torch::randn_like(p);
}

/// Five steps of Fused and Reference from the same parameters and gradients
/// agree, and Reference continues from Fused's checkpoint.
template <typename Fused, typename Reference, typename Options>
void expect_matches_and_shares_checkpoints(const Options& options) {
  auto fused_params = make_parameters();
  auto reference_params = make_parameters();
  Fused fused(fused_params, options);
  Reference reference(reference_params, options);
  ASSERT_TRUE(fused.fused());
  for (int step = 0; step < 5; ++step) {
    set_gradients(fused_params, step);
    set_gradients(reference_params, step);
    fused.step();
    reference.step();
  }
  for (size_t i = 0; i < fused_params.size(); ++i) {
    EXPECT_LT((fused_params[i] - reference_params[i]).abs().max().item<double>(), 1e-6) << "parameter " << i;
    EXPECT_FALSE(torch::equal(fused_params[i], make_parameters()[i])) << "parameter " << i << " never moved";
  }

  // The fused optimizer's state continues in the plain one.
  std::stringstream stream;
  torch::save(fused, stream);
  auto resumed_params = make_parameters();
  for (size_t i = 0; i < resumed_params.size(); ++i) resumed_params[i].data().copy_(fused_params[i]);
  Reference resumed(resumed_params, options);
  torch::load(resumed, stream);
  set_gradients(fused_params, 5);
  set_gradients(resumed_params, 5);
  fused.step();
  resumed.step();
  for (size_t i = 0; i < fused_params.size(); ++i) {
    EXPECT_LT((fused_params[i] - resumed_params[i]).abs().max().item<double>(), 1e-6) << "parameter " << i;
  }
}

TEST(FusedAdamW, MatchesAdamWAndSharesItsCheckpoints) {
  expect_matches_and_shares_checkpoints<ddp::optim::FusedAdamW, torch::optim::AdamW>(
      torch::optim::AdamWOptions(1e-2).weight_decay(0.1).betas({0.9, 0.95}));
}

/// FusedAdamW's own kernel (fp32 contiguous parameters) gives what ATen's
/// fused kernel gives, bit for bit, over steps with a learning rate that
/// changes (five steps: the moments must agree too); a channels_last
/// parameter sends its list to ATen's kernel, with the same results.
TEST(FusedAdamW, EqualsAtensFusedKernelBitForBit) {
  for (const bool channels_last : {false, true}) {
    auto params = make_parameters();
    if (channels_last) {
      params[2] = params[2].detach().contiguous(torch::MemoryFormat::ChannelsLast).requires_grad_();
    }
    std::vector<torch::Tensor> reference, exp_avgs, exp_avg_sqs, steps;
    for (const auto& p : params) {
      reference.push_back(p.detach().clone());
      exp_avgs.push_back(torch::zeros_like(p));
      exp_avg_sqs.push_back(torch::zeros_like(p));
      steps.push_back(torch::zeros({}, p.options()));
    }
    ddp::optim::FusedAdamW optimizer(params, torch::optim::AdamWOptions(1e-2).weight_decay(0.1).betas({0.9, 0.95}));
    ASSERT_TRUE(optimizer.fused());
    for (int step = 0; step < 5; ++step) {
      const double lr = step < 3 ? 1e-2 : 3e-3;
      static_cast<torch::optim::AdamWOptions&>(optimizer.param_groups()[0].options()).lr(lr);
      set_gradients(params, step);
      std::vector<torch::Tensor> grads;
      for (const auto& p : params) grads.push_back(p.grad().clone());
      for (auto& count : steps) count.add_(1);
      optimizer.step();
      at::_fused_adamw_(reference, grads, exp_avgs, exp_avg_sqs, {}, steps, lr, 0.9, 0.95, 0.1, 1e-8, false, false,
                        std::nullopt, std::nullopt);
    }
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(torch::equal(params[i], reference[i]))
          << (channels_last ? "channels_last, " : "") << "parameter " << i << " differs by "
          << (params[i] - reference[i]).abs().max().item<double>();
    }
  }
}

TEST(FusedSGD, MatchesSGDAndSharesItsCheckpoints) {
  expect_matches_and_shares_checkpoints<ddp::optim::FusedSGD, torch::optim::SGD>(
      torch::optim::SGDOptions(1e-2).momentum(0.9).weight_decay(1e-4));
  expect_matches_and_shares_checkpoints<ddp::optim::FusedSGD, torch::optim::SGD>(
      torch::optim::SGDOptions(1e-2).momentum(0.9).nesterov(true));
  expect_matches_and_shares_checkpoints<ddp::optim::FusedSGD, torch::optim::SGD>(torch::optim::SGDOptions(1e-2));
}

/// A step returns while the device still runs what was queued before it: a
/// step that waited for the device would leave the GPU idle while the host
/// launches the step's kernels, every iteration.
template <typename Fused, typename Options>
void expect_step_does_not_wait_for_the_device(const Options& options) {
  auto params = make_parameters();
  Fused optimizer(params, options);
  ASSERT_TRUE(optimizer.fused());
  // A first step loads the kernels and allocates pinned memory, which may
  // synchronise the device once; what must not wait is a step in training.
  set_gradients(params, 0);
  optimizer.step();
  torch::cuda::synchronize();
  for (int step = 1; step < 3; ++step) {
    set_gradients(params, step);
    at::cuda::sleep(int64_t{1} << 31);  // about a second on any current GPU
    at::cuda::CUDAEvent slept;
    slept.record();  // on the current stream, after the sleep and before the step's own work
    optimizer.step();
    EXPECT_FALSE(slept.query()) << "step " << step
                                << " returned only once the device had finished the work queued before it";
    torch::cuda::synchronize();
  }
}

TEST(FusedOptimizers, StepDoesNotWaitForTheDevice) {
  expect_step_does_not_wait_for_the_device<ddp::optim::FusedAdamW>(
      torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  expect_step_does_not_wait_for_the_device<ddp::optim::FusedSGD>(torch::optim::SGDOptions(1e-2).momentum(0.9));
}

}  // namespace
