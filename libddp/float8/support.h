#pragma once

#include <c10/core/Device.h>

namespace ddp::detail {

/// Throws UsageError, saying why and what to use instead, unless `device`
/// can run FP8 matmuls: LibTorch >= 2.4 with at::_scaled_mm and an sm_89+ GPU.
void check_float8_supported(c10::Device device);

}  // namespace ddp::detail
