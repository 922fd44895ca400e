// A copy of a delayed scaling's state: committing the copy gives what a
// commit of the original would, and leaves the original's history, scale and
// pending amax as they were (save_scaling relies on it: it runs on rank 0
// alone and must not move that rank's history ahead of the others'). Runs on
// the CPU's ATen bookkeeping; LibTorch without FP8 dtypes skips it.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "compat/torch_compat.h"
#include "float8/scaling.h"

namespace {

TEST(Float8ScalingState, ACommittedCopyLeavesTheOriginalAlone) {
#if DDP_TORCH_HAS_FLOAT8
  const auto recipe = ddp::Float8Options().scaling(ddp::Float8Scaling::kDelayed).amax_history_len(4);
  ddp::detail::TensorScaling original(recipe, at::kFloat8_e4m3fn, torch::kCPU);
  original.cast(torch::full({16, 16}, 3.0));  // amax 3, pending
  original.cast(torch::full({16, 16}, 5.0));  // commits 3; amax 5 pending
  ASSERT_TRUE(original.amax_pending());
  const torch::Tensor history = original.amax_history().clone();
  const torch::Tensor scale = original.scale().clone();

  ddp::detail::TensorScaling copy = original.with_copied_state();
  copy.commit_pending_amax();
  EXPECT_FALSE(copy.amax_pending());
  EXPECT_EQ(copy.amax_history()[0].item<float>(), 5.0f);
  EXPECT_EQ(copy.amax_history()[1].item<float>(), 3.0f);

  EXPECT_TRUE(original.amax_pending());
  EXPECT_TRUE(torch::equal(original.amax_history(), history));
  EXPECT_TRUE(torch::equal(original.scale(), scale));
  original.commit_pending_amax();  // the original's own commit reaches the copy's values
  EXPECT_TRUE(torch::equal(original.amax_history(), copy.amax_history()));
  EXPECT_TRUE(torch::equal(original.scale(), copy.scale()));
#else
  GTEST_SKIP() << "this LibTorch has no FP8 dtypes";
#endif
}

}  // namespace
