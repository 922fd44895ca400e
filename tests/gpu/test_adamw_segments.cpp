// libddp's AdamW kernel (optim/adamw_segments.h) against ATen's fused AdamW:
// equal bit for bit over runs of every alignment and per-run step counts,
// the learning rate as a number or a device tensor, and a step the
// GradScaler skips changes nothing.

#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "optim/adamw_segments.h"

namespace {

using namespace ddp::detail;

void check_equal(bool lr_on_device, float weight_decay) {
  torch::manual_seed(lr_on_device ? 1 : 2);
  const auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat);
  const std::vector<std::int64_t> sizes{1000, 70001, 5, 16384 * 3 + 17, 4099};
  const double lr = 1e-3;
  const at::Tensor lr_tensor = torch::full({}, lr, f32);
  // Each run its own step count (1, 2, ...): the kernel reads each one's.
  const at::Tensor counts = torch::arange(1, static_cast<std::int64_t>(sizes.size()) + 1, f32);
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  std::vector<at::Tensor> ref_params, ref_exp_avgs, ref_exp_avg_sqs, ref_steps;
  std::vector<AdamWSegment> segments;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::int64_t n = sizes[i];
    // The last run starts off the vectors' boundary: the scalar path.
    params.push_back(i + 1 == sizes.size() ? torch::randn({n + 1}, f32).narrow(0, 1, n) : torch::randn({n}, f32));
    grads.push_back(torch::randn({n}, f32) * 1e-2);
    exp_avgs.push_back(torch::randn({n}, f32) * 1e-3);
    exp_avg_sqs.push_back(torch::rand({n}, f32) * 1e-5);
    ref_params.push_back(params.back().clone());
    ref_exp_avgs.push_back(exp_avgs.back().clone());
    ref_exp_avg_sqs.push_back(exp_avg_sqs.back().clone());
    ref_steps.push_back(torch::full({}, static_cast<double>(i + 1), f32));
    AdamWSegment segment;
    segment.param = params.back().data_ptr<float>();
    segment.exp_avg = exp_avgs.back().data_ptr<float>();
    segment.exp_avg_sq = exp_avg_sqs.back().data_ptr<float>();
    segment.grad = grads.back().data_ptr<float>();
    segment.step = counts.data_ptr<float>() + i;
    segment.numel = n;
    segments.push_back(segment);
  }
  at::_fused_adamw_(ref_params, grads, ref_exp_avgs, ref_exp_avg_sqs, {}, ref_steps, lr, 0.9, 0.999, weight_decay, 1e-8,
                    false, false, std::nullopt, std::nullopt);
  AdamWHyper hyper;
  if (lr_on_device) {
    hyper.lr = lr_tensor.data_ptr<float>();
  } else {
    hyper.lr_value = static_cast<float>(lr);
  }
  hyper.weight_decay = weight_decay;
  adamw_segments_step(segments, hyper, torch::kCUDA);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i], ref_params[i]))
        << "param " << i << " differs by " << (params[i] - ref_params[i]).abs().max().item<float>();
    EXPECT_TRUE(torch::equal(exp_avgs[i], ref_exp_avgs[i])) << "exp_avg " << i;
    EXPECT_TRUE(torch::equal(exp_avg_sqs[i], ref_exp_avg_sqs[i])) << "exp_avg_sq " << i;
  }
  // A step the GradScaler skips leaves everything as it was.
  const at::Tensor found_inf = torch::ones({}, f32);
  hyper.found_inf = found_inf.data_ptr<float>();
  const at::Tensor before = params[1].clone();
  const at::Tensor exp_avg_before = exp_avgs[1].clone();
  adamw_segments_step(segments, hyper, torch::kCUDA);
  EXPECT_TRUE(torch::equal(params[1], before));
  EXPECT_TRUE(torch::equal(exp_avgs[1], exp_avg_before));
}

TEST(AdamWSegments, EqualsAtenFusedAdamW) {
  check_equal(/*lr_on_device=*/true, 0.01f);
  check_equal(/*lr_on_device=*/false, 0.0f);
}

}  // namespace
