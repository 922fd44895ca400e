// Bucket assignment: sizes, dtype grouping, reduction order, short last bucket.

#include <numeric>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "reducer/bucket_assignment.h"

namespace {

using ddp::detail::assign_buckets;
using Buckets = std::vector<std::vector<std::size_t>>;

constexpr std::size_t kMiB = 1 << 20;

std::vector<at::Tensor> floats_of_mib(const std::vector<double>& mebibytes) {
  std::vector<at::Tensor> tensors;
  for (double m : mebibytes) tensors.push_back(torch::empty({static_cast<long>(m * kMiB / 4)}));
  return tensors;
}

std::vector<std::size_t> reversed(std::size_t n) {
  std::vector<std::size_t> order(n);
  std::iota(order.rbegin(), order.rend(), 0);
  return order;
}

TEST(BucketAssignment, FirstBucketSmallThenCapSizedInGivenOrder) {
  const auto tensors = floats_of_mib({4, 4, 4, 4, 4, 4, 0.5, 0.5});
  // Reverse order: 0.5, 0.5 | 4 x 6 ... ; first bucket closes at 1 MiB, later ones at 8 MiB.
  EXPECT_EQ(assign_buckets(tensors, reversed(8), kMiB, 8 * kMiB), (Buckets{{7, 6}, {5, 4}, {3, 2}, {1, 0}}));
}

TEST(BucketAssignment, DtypesNeverShareABucket) {
  std::vector<at::Tensor> tensors = {torch::empty({10}), torch::empty({10}, torch::kDouble), torch::empty({10})};
  EXPECT_EQ(assign_buckets(tensors, {0, 1, 2}, kMiB, kMiB), (Buckets{{0, 2}, {1}}));
}

TEST(BucketAssignment, LastBucketIsCutShort) {
  // The last 8 MiB bucket ends with small tensors: they form their own bucket,
  // so the reduction left after backward is small.
  const auto tensors = floats_of_mib({0.25, 0.25, 0.25, 0.25, 6, 2});
  EXPECT_EQ(assign_buckets(tensors, reversed(6), 2 * kMiB, 16 * kMiB), (Buckets{{5}, {4}, {3, 2, 1, 0}}));
}

TEST(BucketAssignment, OneHugeBucketStaysWhole) {
  const auto tensors = floats_of_mib({1, 1, 1});
  EXPECT_EQ(assign_buckets(tensors, {0, 1, 2}, 1000 * kMiB, 1000 * kMiB), (Buckets{{0, 1, 2}}));
}

}  // namespace
