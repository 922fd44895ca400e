#include "float8/input_sharing.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <ddp/errors.h>
#include <ddp/float8.h>

#include "float8/linear_state.h"

namespace ddp {
namespace detail {

SharedInputCast::SharedInputCast(const std::vector<Float8LinearImpl*>& layers) : members_(layers.size()) {
  for (Float8LinearImpl* layer : layers) layers_.push_back(layer->weak_from_this());
}

std::vector<std::shared_ptr<Float8LinearImpl>> SharedInputCast::layers() const {
  std::vector<std::shared_ptr<Float8LinearImpl>> alive;
  for (const auto& layer : layers_) {
    // A layer not held by a shared_ptr (no module holder) cannot be told apart
    // from a gone one: neither counts.
    std::shared_ptr<Float8LinearImpl> member = std::dynamic_pointer_cast<Float8LinearImpl>(layer.lock());
    if (!member || Float8LinearAccess::shared_input(*member).get() != this) return {};
    alive.push_back(std::move(member));
  }
  return alive;
}

void SharedInputCast::expect(const at::Tensor& placeholder, const Float8Tensor& cast, const void* taker) {
  if (members_ < 2) return;  // the taker is the group: nobody else looks
  cached_ = cast;
  placeholder_ = c10::weak_intrusive_ptr<c10::TensorImpl>(placeholder.getIntrusivePtr());
  source_ = placeholder_;
  source_version_ = static_cast<std::int64_t>(placeholder._version());
  users_.assign({taker});
}

Float8Tensor SharedInputCast::cast(const void* member, const at::Tensor& input, TensorScaling& scaling,
                                   bool with_transposed) {
  // Made on a miss only: a placeholder's rows (zero strides) would be copied
  // out whole by contiguous().
  const auto rows = [&] { return input.reshape({-1, input.size(-1)}).contiguous(); };
  if (input.is_inference()) return scaling.cast(rows(), with_transposed);
  const bool cached = source_ && source_->lock().get() == input.unsafeGetTensorImpl() &&
                      source_version_ == static_cast<std::int64_t>(input._version()) &&
                      std::find(users_.begin(), users_.end(), member) == users_.end() &&
                      (!with_transposed || cached_.transposed.defined());
  if (cached) {
    Float8Tensor result = cached_;
    users_.push_back(member);
    if (users_.size() >= members_) {
      cached_ = Float8Tensor{};
      source_.reset();
      users_.clear();
    }
    return result;
  }
  if (placeholder_ && placeholder_->lock().get() == input.unsafeGetTensorImpl()) {
    throw UsageError(
        "Float8Linear: this input is the output of a fused norm that wrote its FP8 cast for the layers sharing "
        "their input cast, and holds no values; this layer has taken that cast already (or it was dropped): hand "
        "each layer of the group the norm's output once per forward");
  }
  Float8Tensor result = scaling.cast(rows(), with_transposed);
  users_.assign({member});
  if (members_ > 1) {
    cached_ = result;
    source_ = c10::weak_intrusive_ptr<c10::TensorImpl>(input.getIntrusivePtr());
    source_version_ = static_cast<std::int64_t>(input._version());
  }
  return result;
}

}  // namespace detail

namespace float8 {

void share_input_cast(const std::vector<Float8LinearImpl*>& layers) {
  for (const Float8LinearImpl* layer : layers) {
    if (layer == nullptr) throw UsageError("float8::share_input_cast: a layer is null (an empty module holder?)");
    if (layer->options.in_features() != layers.front()->options.in_features()) {
      throw UsageError("float8::share_input_cast: the layers take inputs of different widths (" +
                       std::to_string(layers.front()->options.in_features()) + " and " +
                       std::to_string(layer->options.in_features()) +
                       "); only layers called with the same input "
                       "tensor can share its cast");
    }
  }
  const auto shared = std::make_shared<detail::SharedInputCast>(layers);
  for (Float8LinearImpl* layer : layers) detail::Float8LinearAccess::shared_input(*layer) = shared;
}

}  // namespace float8
}  // namespace ddp
