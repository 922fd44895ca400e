#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace examples {

/// Linear warmup from 0 to `peak` over `warmup` steps, then a cosine decay to
/// `floor` at step `total`; `floor` after it.
inline double warmup_cosine(std::int64_t step, std::int64_t warmup, std::int64_t total, double peak, double floor) {
  if (step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (step >= total) return floor;
  const double progress = static_cast<double>(step - warmup) / static_cast<double>(std::max<std::int64_t>(1, total - warmup));
  return floor + 0.5 * (peak - floor) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace examples
