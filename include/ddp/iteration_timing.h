#pragma once

namespace ddp {

/// Device times of one reduced backward pass, from the end of forward
/// (DistributedDataParallel::timings, with record_timeline on CUDA).
struct IterationTiming {
  double backward_ms = 0;               ///< Until the last backward kernel ends.
  double communication_ms = 0;          ///< Time the bucket reductions ran.
  double exposed_communication_ms = 0;  ///< Reductions still running after the last backward kernel.
};

}  // namespace ddp
