#pragma once

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>

#include <ddp/float8_tensor.h>

#include "float8/scaling.h"
#include "optim/weight_casts.h"

namespace ddp::detail {

// The casts of a Float8Linear's weight that the fused optimizer writes as it
// updates the weight (optim/weight_casts.h): the FP8 cast, or the bf16 copy.

/// Which state of a weight a written cast is of: the weight's data pointer
/// and version counter when the step wrote it. The step's kernel writes
/// through pointers and leaves the version alone; an in-place change since
/// (a checkpoint loaded, the user's) moves it.
class WeightStamp {
 public:
  void record(const at::Tensor& weight) {
    version_ = weight._version();
    data_ = weight.data_ptr();
  }
  void clear() { data_ = nullptr; }
  /// Whether `weight` is as it was when recorded (never, once cleared).
  bool matches(const at::Tensor& weight) const {
    return data_ != nullptr && weight.data_ptr() == data_ && weight._version() == version_;
  }

 private:
  std::int64_t version_ = -1;
  const void* data_ = nullptr;
};

/// The FP8 cast of a Float8Linear's weight (delayed scaling) that the fused
/// optimizer writes as it updates the weight, for the next forward to take
/// instead of casting. Exactly the cast that forward would make: same scale
/// (nothing commits between the step and the forward, or the cast is
/// withdrawn), same bytes, its amax pending from the forward on. The buffers
/// persist, so that a recorded step's forward reads what the replay before
/// it wrote.
///
/// A change of the weight between the step and the forward is seen through
/// the weight's version counter and data pointer: one that bypasses both
/// (writing through weight.data(), a kernel or collective of one's own)
/// leaves the forward the cast of the weight as the step left it.
class OptimizerWrittenWeightCast final : public WeightCastTarget {
 public:
  /// `weight_scaling`: a copy of the layer's, sharing its state.
  explicit OptimizerWrittenWeightCast(TensorScaling weight_scaling) : scaling_(std::move(weight_scaling)) {}

  std::optional<WeightCast> before_update(const at::Tensor& weight) override;
  void after_update(const at::Tensor& weight) override;
  void before_replay(const at::Tensor& weight) override;

  /// The cast the optimizer wrote of `weight` as it is now, taken; nullopt
  /// (and a cast of an older weight withdrawn) where there is none.
  std::optional<Float8Tensor> take(const at::Tensor& weight);

 private:
  /// Whether the cast waiting is of `weight` as it is now: no in-place change
  /// (a checkpoint load, the user's) since the step wrote it.
  bool written_for(const at::Tensor& weight) const;
  /// Makes the buffers for `weight`; false where the step's kernel cannot
  /// write its cast (not a CUDA fp32 contiguous matrix of rows and columns
  /// in multiples of four).
  bool allocate_for(const at::Tensor& weight);

  TensorScaling scaling_;
  Float8Tensor buffers_;  // data, transposed and inverse scale
  WeightStamp written_from_;
};

/// The bf16 copy of a Float8Linear's weight that the fused optimizer writes
/// as it updates the weight, for the forwards under bf16 autocast (FP8 off)
/// to multiply with instead of converting the weight each time: the bytes
/// of that conversion, good for every forward until the weight changes (no
/// scaling state). Persistent as the FP8 cast's buffers, and with the same
/// limit: a change that bypasses the weight's version counter and data
/// pointer is not seen.
class OptimizerWrittenWeightCopy final : public WeightCastTarget {
 public:
  std::optional<WeightCast> before_update(const at::Tensor& weight) override;
  void after_update(const at::Tensor& weight) override;
  void before_replay(const at::Tensor& weight) override;

  /// The copy of `weight` as it is now, or nullopt where none was written.
  std::optional<at::Tensor> take(const at::Tensor& weight);

 private:
  at::Tensor copy_;
  WeightStamp written_from_;  // cleared while the copy is of no state of the weight
};

}  // namespace ddp::detail
