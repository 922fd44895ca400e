#include "float8/scaling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

#include <ATen/ATen.h>

#include <ddp/errors.h>

#include "compat/torch_compat.h"
#include "float8/kernels.h"

namespace ddp {

#ifndef DDP_WITH_CUDA_KERNELS
void float8::cast_transpose(const at::Tensor&, Float8Tensor&) {
  throw UsageError(
      "ddp::float8::cast_transpose: this libddp was built without its CUDA kernels (they need "
      "LibTorch >= 2.1 with CUDA); rebuild it against such a LibTorch");
}
#endif

namespace detail {

double float8_largest(c10::ScalarType float8_dtype) {
#if DDP_TORCH_HAS_FLOAT8
  if (float8_dtype == at::kFloat8_e4m3fn) return 448.0;
  if (float8_dtype == at::kFloat8_e5m2) return 57344.0;
#endif
  TORCH_CHECK(false, "Float8Linear: ", c10::toString(float8_dtype), " is not an FP8 dtype");
}

namespace {

/// max |tensor| as fp32: the inf-norm is one pass over the tensor. Taken in
/// the tensor's own dtype (a maximum rounds nothing, and ATen refuses to
/// narrow fp64 to fp32 inside the norm), then converted. An empty tensor's
/// is 0 (ATen's inf-norm refuses empty tensors).
at::Tensor amax_of(const at::Tensor& tensor) {
  if (tensor.numel() == 0) return at::zeros({}, tensor.options().dtype(at::kFloat));
  return at::linalg_vector_norm(tensor, std::numeric_limits<double>::infinity()).to(at::kFloat);
}

#ifdef DDP_WITH_CUDA_KERNELS
bool fits_cast_kernel(const at::Tensor& tensor) {
  const c10::ScalarType dtype = tensor.scalar_type();
  return tensor.is_cuda() && tensor.dim() == 2 && (dtype == at::kBFloat16 || dtype == at::kHalf || dtype == at::kFloat);
}
#endif

/// saturate(tensor * scale) in `float8_dtype` by ATen's ops, for what the
/// kernel does not take (CPU tensors, LibTorch without the kernels). The
/// product is formed in fp32, as the kernel forms it, so that both paths give
/// the same bytes (a bf16 product would round twice); the conversion does
/// not saturate (values past the range become NaN), hence the clamp.
Float8Tensor convert_with_aten(const at::Tensor& tensor, const at::Tensor& scale, c10::ScalarType float8_dtype,
                               bool with_transposed) {
  const double largest = float8_largest(float8_dtype);
  Float8Tensor result;
  result.data = (tensor.to(at::kFloat) * scale).clamp(-largest, largest).to(float8_dtype);
  if (with_transposed) result.transposed = result.data.t().contiguous();
  result.scale = scale;
  result.inverse_scale = scale.reciprocal();
  return result;
}

}  // namespace

TensorScaling::TensorScaling(const Float8Options& options, c10::ScalarType float8_dtype, const c10::Device& device)
    : options_(options), float8_dtype_(float8_dtype) {
  if (delayed()) {
    const auto fp32 = at::TensorOptions().device(device).dtype(at::kFloat);
    state_ = c10::make_intrusive<DelayedScalingState>();
    state_->amax_history = at::zeros({options.amax_history_len()}, fp32);
    // Until an amax is recorded the cast is unscaled, as in Transformer Engine.
    state_->scale = at::ones({}, fp32);
    state_->pending_amax = at::zeros({}, fp32);
    state_->scale_target = static_cast<float>(float8_largest(float8_dtype) / std::ldexp(1.0, options.margin()));
    state_->use_max = options.amax_compute() == AmaxCompute::kMax;
  }
}

Float8Tensor TensorScaling::cast(const at::Tensor& tensor, bool with_transposed, bool with_data) {
  TORCH_CHECK(with_data || with_transposed, "TensorScaling::cast: asked for neither the data nor its transpose");
  // The scale of this cast comes from every earlier amax (values may exceed
  // the format's range: the cast saturates them); this cast's amax, taken
  // in the same pass, waits for the next commit.
  commit_pending_amax();
#ifdef DDP_WITH_CUDA_KERNELS
  if (fits_cast_kernel(tensor)) {
    // One kernel reads the tensor once, where ATen takes a pass each for the
    // multiply, the clamp, the conversion, the amax and the transpose, and
    // the scale arithmetic is done in the kernels instead of 1-element ATen
    // kernels (about 12 launches per cast under delayed scaling).
    const at::Tensor input = tensor.contiguous();
    Float8Tensor cast;
    const auto float8 = input.options().dtype(float8_dtype_);
    if (with_data) cast.data = at::empty(input.sizes(), float8);
    if (with_transposed) cast.transposed = at::empty({input.size(1), input.size(0)}, float8);
    if (delayed()) {
      cast.amax = state_->pending_amax;
      cast.scale = state_->scale;
      state_->amax_pending = true;
    } else {
      // The amax maps to the largest finite value, so it is needed before
      // the cast, in a pass of its own.
      cast.amax = amax_of(input);
    }
    float8::cast_transpose(input, cast);
    return cast;
  }
#endif
  if (!delayed()) {
    const at::Tensor amax = amax_of(tensor);
    Float8Tensor cast = convert_with_aten(tensor, float8_largest(float8_dtype_) / amax.clamp_min(kFloat8MinAmax),
                                          float8_dtype_, with_transposed);
    cast.amax = amax;
    return cast;
  }
  Float8Tensor cast = convert_with_aten(tensor, state_->scale, float8_dtype_, with_transposed);
  state_->pending_amax.copy_(amax_of(tensor));
  state_->amax_pending = true;
  cast.amax = state_->pending_amax;
  return cast;
}

Float8Tensor TensorScaling::destination(int64_t rows, int64_t cols) {
  TORCH_CHECK(delayed(), "TensorScaling::destination: a cast written by another kernel needs delayed scaling");
  commit_pending_amax();
  const auto float8 = state_->scale.options().dtype(float8_dtype_);
  Float8Tensor destination;
  destination.data = at::empty({rows, cols}, float8);
  destination.transposed = at::empty({cols, rows}, float8);
  destination.amax = state_->pending_amax;
  destination.scale = state_->scale;
  destination.inverse_scale = at::empty({}, state_->scale.options());
  return destination;
}

at::Tensor TensorScaling::offer(const Float8Tensor& written, at::IntArrayRef sizes, c10::ScalarType dtype) {
  TORCH_CHECK(delayed(), "TensorScaling::offer: a cast written by another kernel needs delayed scaling");
  state_->amax_pending = true;
  const std::vector<int64_t> no_strides(sizes.size(), 0);
  state_->offered_for = at::empty_strided(sizes, no_strides, state_->scale.options().dtype(dtype));
  state_->offered = written;
  return state_->offered_for;
}

std::optional<Float8Tensor> TensorScaling::take_offered(const at::Tensor& tensor, const char* role) {
  if (!delayed() || !state_->offered_for.defined()) return std::nullopt;
  const at::Tensor offered_for = std::move(state_->offered_for);
  Float8Tensor offered = std::move(state_->offered);
  state_->offered_for.reset();
  state_->offered = Float8Tensor{};
  if (tensor.data_ptr() != offered_for.data_ptr() || tensor.sizes() != offered_for.sizes()) {
    throw UsageError("Float8Linear: a fused kernel wrote the FP8 cast of this layer's " + std::string(role) +
                     " and returned a tensor " + c10::str(offered_for.sizes()) +
                     " that holds no values in its "
                     "place, but the layer got another tensor " +
                     c10::str(tensor.sizes()) +
                     "; hand the layer "
                     "exactly what the fused op returned (a fused op feeds one layer directly)");
  }
  return offered;
}

bool TensorScaling::prepare_weight_cast(Float8Tensor& into) {
  TORCH_CHECK(delayed(),
              "TensorScaling::prepare_weight_cast: a weight cast written by the optimizer needs delayed scaling");
  withdraw_weight_cast();
  if (state_->amax_pending) return false;
  // After a commit pending_amax is zero: the step max-accumulates into it.
  into.amax = state_->pending_amax;
  into.scale = state_->scale;
  return true;
}

bool TensorScaling::take_weight_cast() {
  if (!weight_cast_offered() || state_->amax_pending) return false;
  state_->weight_cast_offered = false;
  state_->amax_pending = true;
  return true;
}

void TensorScaling::withdraw_weight_cast() {
  if (!weight_cast_offered()) return;
  state_->pending_amax.zero_();
  state_->weight_cast_offered = false;
}

void TensorScaling::commit_pending_amax() {
  withdraw_weight_cast();
  if (amax_pending()) commit_pending_amaxes({this});
}

at::Tensor TensorScaling::latest_amax() {
  if (!delayed()) return {};
  commit_pending_amax();
  return state_->amax_history.narrow(0, 0, 1);
}

void TensorScaling::refresh_scale() {
  if (!delayed()) return;
  commit_pending_amax();
#ifdef DDP_WITH_CUDA_KERNELS
  if (state_->amax_history.is_cuda()) {
    update_amax_histories({state_.get()}, /*enter_amaxes=*/false);
    return;
  }
#endif
  update_history_with_aten(*state_, /*amax=*/at::Tensor());
}

void TensorScaling::update_history_with_aten(DelayedScalingState& state, const at::Tensor& amax) {
  at::Tensor& history = state.amax_history;
  if (amax.defined()) {
    history.copy_(history.roll(1));
    history.narrow(0, 0, 1).copy_(amax.reshape({1}));
  }
  const at::Tensor history_amax = state.use_max ? history.max() : history.select(0, 0);
  // A zero amax (nothing seen yet, or an all-zero tensor) keeps the old
  // scale, and so does an overflow: an infinite amax would zero the scale.
  at::Tensor& scale = state.scale;
  scale.copy_(at::where(history_amax.isfinite() & (history_amax > 0),
                        state.scale_target / history_amax.clamp_min(kFloat8MinAmax), scale));
}

void TensorScaling::commit_pending_amaxes(const std::vector<TensorScaling*>& scalings, const at::Tensor& amaxes) {
  std::vector<DelayedScalingState*> committed;
  std::unordered_set<const DelayedScalingState*> states;
  for (TensorScaling* scaling : scalings) {
    if (!scaling->delayed()) continue;
    // Two blocks of one launch must never update the same history.
    TORCH_CHECK(states.insert(scaling->state_.get()).second,
                "commit_pending_amaxes: the same delayed scaling is listed twice");
    scaling->withdraw_weight_cast();
    if (amaxes.defined() || scaling->state_->amax_pending) committed.push_back(scaling->state_.get());
  }
  TORCH_CHECK(!amaxes.defined() || amaxes.numel() == static_cast<int64_t>(committed.size()),
              "commit_pending_amaxes: ", amaxes.numel(), " amaxes for ", committed.size(), " delayed scalings");
  if (committed.empty()) return;
  for (DelayedScalingState* state : committed) state->amax_pending = false;
#ifdef DDP_WITH_CUDA_KERNELS
  const c10::Device device = committed.front()->amax_history.device();
  const bool one_gpu = std::all_of(committed.begin(), committed.end(), [&](const DelayedScalingState* state) {
    return state->amax_history.device() == device;
  });
  if (device.is_cuda() && one_gpu) {
    update_amax_histories(committed, /*enter_amaxes=*/true,
                          amaxes.defined() ? amaxes.to(device, at::kFloat).contiguous() : at::Tensor());
    return;
  }
#endif
  for (std::size_t i = 0; i < committed.size(); ++i) {
    DelayedScalingState& state = *committed[i];
    const at::Tensor amax =
        amaxes.defined() ? amaxes.select(0, static_cast<int64_t>(i)).to(at::kFloat) : state.pending_amax.clone();
    state.pending_amax.zero_();
    update_history_with_aten(state, amax.to(state.amax_history.device()));
  }
}

void TensorScaling::to(const c10::Device& device) {
  if (!delayed()) return;
  withdraw_weight_cast();
  state_->offered_for.reset();  // a cast on the old device
  state_->offered = Float8Tensor{};
  state_->amax_history = state_->amax_history.to(device);
  state_->scale = state_->scale.to(device);
  state_->pending_amax = state_->pending_amax.to(device);
}

TensorScaling TensorScaling::with_copied_state() const {
  TensorScaling copy = *this;
  if (!delayed()) return copy;
  auto state = c10::make_intrusive<DelayedScalingState>();
  state->amax_history = state_->amax_history.clone();
  state->scale = state_->scale.clone();
  // An untaken weight cast's amax is no cast's yet (its flag stays here).
  state->pending_amax =
      state_->weight_cast_offered ? at::zeros_like(state_->pending_amax) : state_->pending_amax.clone();
  state->amax_pending = state_->amax_pending;
  state->scale_target = state_->scale_target;
  state->use_max = state_->use_max;
  copy.state_ = std::move(state);
  return copy;
}

void TensorScaling::save_to(torch::autograd::AutogradContext* context, const std::string& prefix) const {
  auto& saved = context->saved_data;
  saved[prefix + "scaling"] = static_cast<int64_t>(options_.scaling());
  saved[prefix + "amax_compute"] = static_cast<int64_t>(options_.amax_compute());
  saved[prefix + "margin"] = static_cast<int64_t>(options_.margin());
  saved[prefix + "dtype"] = static_cast<int64_t>(float8_dtype_);
  if (delayed()) saved[prefix + "state"] = c10::IValue::make_capsule(state_);
}

TensorScaling TensorScaling::load_from(torch::autograd::AutogradContext* context, const std::string& prefix) {
  auto& saved = context->saved_data;
  TensorScaling scaling;
  scaling.options_.scaling(static_cast<Float8Scaling>(saved[prefix + "scaling"].toInt()))
      .amax_compute(static_cast<AmaxCompute>(saved[prefix + "amax_compute"].toInt()))
      .margin(static_cast<int>(saved[prefix + "margin"].toInt()));
  scaling.float8_dtype_ = static_cast<c10::ScalarType>(saved[prefix + "dtype"].toInt());
  if (scaling.delayed()) {
    scaling.state_ = c10::static_intrusive_pointer_cast<DelayedScalingState>(saved[prefix + "state"].toCapsule());
  }
  return scaling;
}

}  // namespace detail
}  // namespace ddp
