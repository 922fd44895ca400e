#pragma once

// A layer that multiplies with a cast of its weight (Float8Linear: the FP8
// copy and its transpose, or under bf16 autocast the bf16 copy) can have the
// fused optimizer write that cast in the same pass as it updates the weight,
// instead of the next forward reading the fp32 weight again to cast it
// (LLaMA-1.1B in FP8 on an H200: 110 casts, 1.8 ms of an 83 ms step,
// 2026-11-29). Transformer Engine's FusedAdam writes its FP8 parameters from
// the master weights the same way.
//
// The layer registers a WeightCastTarget for its weight; FusedAdamW asks it,
// parameter by parameter, where to write. The registry holds no layer alive.

#include <cstdint>
#include <memory>
#include <optional>

#include <ATen/core/Tensor.h>

namespace ddp::detail {

/// Where the optimizer writes the E4M3 cast of an updated [rows, cols] fp32
/// weight (device pointers): saturate(w * *scale) row-major to `data` and
/// column-major to `transposed`, max |w| max-accumulated into *amax, 1 / *scale
/// to *inverse_scale. float8::cast_transpose writes the same bytes.
struct Float8WeightCast {
  std::uint8_t* data = nullptr;
  std::uint8_t* transposed = nullptr;
  const float* scale = nullptr;
  float* amax = nullptr;
  float* inverse_scale = nullptr;
  std::int64_t rows = 0, cols = 0;
};

/// What the optimizer writes of an updated weight: its FP8 cast (float8.data
/// set) or its bf16 copy (bfloat16 set).
struct WeightCast {
  Float8WeightCast float8;
  /// The weight rounded to bf16 (to nearest even, as ATen's conversion),
  /// row-major, on the device.
  void* bfloat16 = nullptr;
};

class WeightCastTarget {
 public:
  virtual ~WeightCastTarget() = default;
  /// Before a step that updates `weight`: where to write its cast, or nullopt
  /// to write none this step (the target then drops what it holds of the
  /// weight as it was).
  virtual std::optional<WeightCast> before_update(const at::Tensor& weight) = 0;
  /// After the step that writes the cast was queued (or recorded).
  virtual void after_update(const at::Tensor& weight) = 0;
  /// Before a replay of a recorded step, whose recorded forward reads the cast
  /// the replay before it wrote: writes it again from `weight` where the
  /// weight or its scaling changed in between (a checkpoint loaded).
  virtual void before_replay(const at::Tensor& weight) = 0;
};

/// Registers `target` for `weight` (replacing an earlier one); kept while the
/// target lives elsewhere.
void set_weight_cast_target(const at::Tensor& weight, const std::shared_ptr<WeightCastTarget>& target);
/// The living target registered for `weight` itself (not a tensor that
/// reuses its address), or null.
std::shared_ptr<WeightCastTarget> weight_cast_target(const at::Tensor& weight);

}  // namespace ddp::detail
