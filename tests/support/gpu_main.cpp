// main() of the GPU test binaries: with fewer than DDP_TEST_GPUS_NEEDED GPUs,
// or where DDP_TEST_NEEDS_FLOAT8 without FP8 matmuls on the GPU, they exit
// with 77, which ctest reports as skipped rather than passed.

#include <cstdio>
#include <cstdlib>

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "support/float8_gpu.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const bool listing = ::testing::GTEST_FLAG(list_tests);
  const bool rank_process = std::getenv("DDP_TEST_CHILD_RANK") != nullptr;
  if (!listing && !rank_process && torch::cuda::device_count() < DDP_TEST_GPUS_NEEDED) {
    std::printf("SKIPPED: these tests need %d GPU(s); %d visible\n", DDP_TEST_GPUS_NEEDED,
                static_cast<int>(torch::cuda::device_count()));
    return 77;
  }
#if DDP_TEST_NEEDS_FLOAT8
  if (!listing && !rank_process) {
    if (const std::string why = ddp::testing::float8_unsupported_reason(); !why.empty()) {
      std::printf("SKIPPED: these tests need FP8 matmuls: %s\n", why.c_str());
      return 77;
    }
  }
#endif
  return RUN_ALL_TESTS();
}
