// Gradient layouts against their bucket slices: which gradients the reducer
// may copy into a bucket as plain memory, in one kernel for the whole bucket.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "reducer/row_major.h"

namespace {

using ddp::detail::alias;
using ddp::detail::flat_layout_strides;
using ddp::detail::same_memory_layout;

// The slice of a flat buffer that the reducer gives `parameter`.
at::Tensor slice_for(const at::Tensor& parameter, const at::Tensor& buffer) {
  return alias(buffer, 0, parameter.sizes(), flat_layout_strides(parameter));
}

TEST(GradientLayout, AOneByOneWeightsChannelsLastGradientMatchesItsSlice) {
  // ResNet's 1x1 weights, made channels_last by contiguous(ChannelsLast),
  // keep (C, 1, 1, 1); cuDNN writes their gradients as (C, 1, C, C) (seen on
  // an H200, 2026-11-28): the same memory, other strides.
  const at::Tensor weight = torch::randn({8, 4, 1, 1});
  const at::Tensor grad = torch::randn({8, 4, 1, 1}).as_strided({8, 4, 1, 1}, {4, 1, 4, 4});
  ASSERT_NE(grad.strides(), weight.strides());
  const at::Tensor buffer = torch::zeros({weight.numel()});
  const at::Tensor slice = slice_for(weight, buffer);
  ASSERT_TRUE(same_memory_layout(grad, slice));
  // So copying its memory is copying its elements.
  buffer.copy_(grad.as_strided({grad.numel()}, {1}, grad.storage_offset()));
  EXPECT_TRUE(torch::equal(slice, grad));
}

TEST(GradientLayout, OtherOrdersSizesAndOverlapsDoNot) {
  const at::Tensor weight = torch::randn({4, 3, 2, 2}).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor slice = slice_for(weight, torch::zeros({weight.numel()}));
  EXPECT_TRUE(same_memory_layout(torch::randn({4, 3, 2, 2}).contiguous(at::MemoryFormat::ChannelsLast), slice));
  EXPECT_FALSE(same_memory_layout(torch::randn({4, 3, 2, 2}), slice));  // row-major
  EXPECT_FALSE(same_memory_layout(torch::randn({4, 3, 4}), slice));     // other sizes
  const at::Tensor matrix_slice = slice_for(torch::randn({4, 6}), torch::zeros({24}));
  EXPECT_FALSE(same_memory_layout(torch::randn({6, 4}).t(), matrix_slice));               // transposed
  EXPECT_FALSE(same_memory_layout(torch::randn({4, 1}).expand({4, 6}), matrix_slice));    // overlapping
  EXPECT_FALSE(same_memory_layout(torch::randn({4, 12}).narrow(1, 0, 6), matrix_slice));  // with gaps
}

}  // namespace
