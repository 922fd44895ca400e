#pragma once

// Whether work queued now is being recorded into a CUDA graph (ddp::CapturedStep)
// rather than run. What a recorded step must not do then: read a value on the
// host, or bake one in that later replays should see change.

#ifdef DDP_WITH_CUDA
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

namespace ddp::detail {

/// True while the current CUDA stream is capturing. Always false in builds
/// without CUDA.
inline bool current_stream_capturing() {
#ifdef DDP_WITH_CUDA
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
#else
  return false;
#endif
}

}  // namespace ddp::detail
