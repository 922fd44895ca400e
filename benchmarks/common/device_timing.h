#pragma once

// Timing of GPU work from the host: a batch of calls between two device
// synchronisations, the best of several trials (launch overhead amortised,
// interference from other work on the machine filtered out).

#include <algorithm>
#include <chrono>
#include <functional>

#include <torch/cuda.h>

namespace bench {

/// Milliseconds per call of `body`: the best trial of `iterations` calls, after 3 warm-up calls.
inline double best_ms_per_call(int iterations, int trials, const std::function<void()>& body) {
  for (int i = 0; i < 3; ++i) body();
  torch::cuda::synchronize();
  double best = 1e30;
  for (int trial = 0; trial < trials; ++trial) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) body();
    torch::cuda::synchronize();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    best = std::min(best, ms / iterations);
  }
  return best;
}

}  // namespace bench
