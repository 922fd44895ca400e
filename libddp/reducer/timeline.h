#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <ddp/communicator.h>
#include <ddp/iteration_timing.h>

namespace ddp::detail {

/// Records, for each backward pass DDP reduces, when the backward kernels ran,
/// when each bucket's gradients became ready and when its reduction ran, in
/// device time (CUDA events; the CPU backends record nothing). The result is
/// a Chrome-trace JSON file that Perfetto and chrome://tracing open, and a
/// summary per iteration, with the communication left exposed after the last
/// backward kernel.
class Timeline {
 public:
  /// path: where to write the trace when destroyed ("" for none).
  Timeline(c10::Device device, int rank, std::string path);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  /// The backward that follows will reduce: marks its start on the current stream.
  void begin_backward();
  /// A communicator for the comm hook of bucket `bucket`: it forwards every
  /// collective to `comm` and marks when its inputs were ready and when it finished.
  std::unique_ptr<Communicator> observe(Communicator& comm, std::size_t bucket, std::size_t bytes);
  /// Every backward kernel is queued: marks the end of the compute on the current stream.
  void end_backward_compute();

  /// Every finished iteration so far (waits for the device to reach them).
  std::vector<IterationTiming> timings();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp::detail
