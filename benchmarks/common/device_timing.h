#pragma once

// Timing of GPU work from the host: a batch of calls between two device
// synchronisations, the best of several trials (launch overhead amortised,
// interference from other work on the machine filtered out).

#include <algorithm>
#include <chrono>
#include <functional>

#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
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

/// Milliseconds per call of `body` on the GPU alone: `iterations` calls
/// recorded into one CUDA graph, replayed `trials` times, the best replay
/// over `iterations`. Launches and host work (autograd's included) do not
/// count, as in a training step recorded by ddp::CapturedStep: small kernels,
/// whose launches take longer than they run, are measured by what they cost
/// the device.
inline double best_graph_ms_per_call(int iterations, int trials, const std::function<void()>& body) {
  // Capture needs a stream other than the legacy default one; warm-up there
  // settles workspaces and the allocator first.
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  at::cuda::CUDAGraph graph;
  {
    const c10::cuda::CUDAStreamGuard guard(side);
    for (int i = 0; i < 3; ++i) body();
    side.synchronize();
    graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    for (int i = 0; i < iterations; ++i) body();
    graph.capture_end();
  }
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);  // cudaEventDefault: with timing
  double best = 1e30;
  for (int trial = 0; trial < trials; ++trial) {
    start.record();
    graph.replay();
    stop.record();
    stop.synchronize();
    best = std::min(best, static_cast<double>(start.elapsed_time(stop)) / iterations);
  }
  return best;
}

}  // namespace bench
