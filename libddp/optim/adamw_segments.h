#pragma once

// AdamW over runs of fp32 parameters in one launch, its arithmetic ATen's
// fused AdamW's element for element (the same results bit for bit), at 94%
// of the copy bandwidth where ATen's multi-tensor kernel reaches about 80%
// (LLaMA-1.1B on an H200: 7.6 against 9.2 ms a step, 2026-11-29).
// FusedAdamW steps its fp32 contiguous parameters with it. A segment can
// also write the cast of its updated weight (optim/weight_casts.h): a bf16
// copy as it goes, or an FP8 cast, for which its blocks update 64 x 64 tiles,
// each writing its FP8 tile row-major and, through shared memory,
// transposed.

#include <cstdint>
#include <vector>

#include <c10/core/Device.h>

#include "optim/weight_casts.h"

namespace ddp::detail {

/// One contiguous run of elements the step updates.
struct AdamWSegment {
  float* param = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  const float* grad = nullptr;
  /// On the device: this run's step count after this step.
  const float* step = nullptr;
  std::int64_t numel = 0;
  /// The cast of the updated parameter to write, or none. An FP8 cast
  /// (cast.float8.data set) takes a [rows, cols] matrix with rows and cols
  /// multiples of 4 and every array 16-byte aligned (the caller checks); a
  /// bf16 copy, an 8-byte aligned one where the arrays are 16-byte aligned.
  WeightCast cast;
  std::int64_t first_chunk = 0;  ///< Set by adamw_segments_step.
};

struct AdamWHyper {
  const float* lr = nullptr;  ///< On the device (a replay reads the current one); null: lr_value.
  float lr_value = 0;
  float beta1 = 0.9f, beta2 = 0.999f, weight_decay = 0.01f, eps = 1e-8f;
  const float* found_inf = nullptr;  ///< On the device: 1 skips the step (GradScaler); null: never.
};

/// Queues the step over `segments` (their parameters on `device`) on the
/// device's current stream: the table of segments through kernel arguments
/// (a few small launches), then one launch for every segment. Records into
/// a CUDA graph as it runs eagerly; the host never waits for the device.
void adamw_segments_step(std::vector<AdamWSegment> segments, const AdamWHyper& hyper, c10::Device device);

}  // namespace ddp::detail
