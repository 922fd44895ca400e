#pragma once

// FP8 tests skip on a GPU that cannot run FP8 matmuls (before sm_89, or a
// LibTorch without at::_scaled_mm), saying why, instead of failing there.

#include <string>

#include <c10/core/Device.h>

#include <ddp/errors.h>
#include <ddp/precision.h>

namespace ddp::testing {

/// Why the first GPU cannot train in FP8 (libddp's own message); empty where it can.
inline std::string float8_unsupported_reason() {
  try {
    ddp::PrecisionPolicy::parse("fp8").check_supported(c10::Device(c10::kCUDA, 0));
  } catch (const ddp::UsageError& e) {
    return e.what();
  }
  return {};
}

}  // namespace ddp::testing

/// First statement of a test that needs FP8 matmuls on GPU 0.
#define DDP_SKIP_WITHOUT_FLOAT8()                                                          \
  do {                                                                                     \
    if (const std::string why = ddp::testing::float8_unsupported_reason(); !why.empty()) { \
      GTEST_SKIP() << why;                                                                 \
    }                                                                                      \
  } while (false)
