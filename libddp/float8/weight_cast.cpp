#include "float8/weight_cast.h"

#include <ATen/ATen.h>

namespace ddp::detail {

bool OptimizerWrittenWeightCast::allocate_for(const at::Tensor& weight) {
  // The tiles of the step's cast take 16-byte loads of whole rows of four.
  if (!weight.is_cuda() || weight.scalar_type() != at::kFloat || weight.dim() != 2 || !weight.is_contiguous() ||
      weight.numel() == 0 || weight.size(0) % 4 != 0 || weight.size(1) % 4 != 0) {
    return false;
  }
  if (!buffers_.data.defined() || buffers_.data.sizes() != weight.sizes() ||
      buffers_.data.device() != weight.device()) {
    const auto float8 = weight.options().dtype(at::kFloat8_e4m3fn);
    buffers_.data = at::empty(weight.sizes(), float8);
    buffers_.transposed = at::empty({weight.size(1), weight.size(0)}, float8);
    buffers_.inverse_scale = at::empty({}, weight.options());
  }
  return true;
}

std::optional<WeightCast> OptimizerWrittenWeightCast::before_update(const at::Tensor& weight) {
  scaling_.withdraw_weight_cast();  // of the weight before this step
  if (!allocate_for(weight) || !scaling_.prepare_weight_cast(buffers_)) return std::nullopt;
  WeightCast written;
  Float8WeightCast& cast = written.float8;
  cast.data = static_cast<std::uint8_t*>(buffers_.data.data_ptr());
  cast.transposed = static_cast<std::uint8_t*>(buffers_.transposed.data_ptr());
  cast.scale = buffers_.scale.data_ptr<float>();
  cast.amax = buffers_.amax.data_ptr<float>();
  cast.inverse_scale = buffers_.inverse_scale.data_ptr<float>();
  cast.rows = weight.size(0);
  cast.cols = weight.size(1);
  return written;
}

void OptimizerWrittenWeightCast::after_update(const at::Tensor& weight) {
  written_from_.record(weight);
  scaling_.weight_cast_written();
}

void OptimizerWrittenWeightCast::before_replay(const at::Tensor& weight) {
  if (written_for(weight) || !allocate_for(weight)) return;
  // Since the last replay the weight changed (a checkpoint loaded), or
  // something took or withdrew the cast (an eager forward, a commit): the
  // recorded forward reads these buffers, so they get the cast of the weight
  // as it is now with the scale as it is now, which that forward's own cast
  // would use. Its amax joins whatever is pending, as that cast's would; an
  // untaken cast of an older weight leaves first.
  scaling_.withdraw_weight_cast();
  buffers_.amax = scaling_.pending_amax();
  buffers_.scale = scaling_.scale();
  float8::cast_transpose(weight, buffers_);
  after_update(weight);
}

std::optional<Float8Tensor> OptimizerWrittenWeightCast::take(const at::Tensor& weight) {
  if (!written_for(weight)) {
    scaling_.withdraw_weight_cast();
    return std::nullopt;
  }
  if (!scaling_.take_weight_cast()) return std::nullopt;
  return buffers_;
}

bool OptimizerWrittenWeightCast::written_for(const at::Tensor& weight) const {
  return scaling_.weight_cast_offered() && written_from_.matches(weight);
}

std::optional<WeightCast> OptimizerWrittenWeightCopy::before_update(const at::Tensor& weight) {
  written_from_.clear();
  if (!weight.is_cuda() || weight.scalar_type() != at::kFloat || !weight.is_contiguous() || weight.numel() == 0) {
    return std::nullopt;
  }
  if (!copy_.defined() || copy_.sizes() != weight.sizes() || copy_.device() != weight.device()) {
    copy_ = at::empty(weight.sizes(), weight.options().dtype(at::kBFloat16));
  }
  WeightCast written;
  written.bfloat16 = copy_.data_ptr();
  return written;
}

void OptimizerWrittenWeightCopy::after_update(const at::Tensor& weight) { written_from_.record(weight); }

void OptimizerWrittenWeightCopy::before_replay(const at::Tensor& weight) {
  if (written_from_.matches(weight) || !before_update(weight).has_value()) return;
  copy_.copy_(weight);  // as the recorded forward's own conversion would round it
  after_update(weight);
}

std::optional<at::Tensor> OptimizerWrittenWeightCopy::take(const at::Tensor& weight) {
  if (!written_from_.matches(weight)) return std::nullopt;
  return copy_;
}

}  // namespace ddp::detail
