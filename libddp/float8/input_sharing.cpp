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

Float8Tensor SharedInputCast::cast(const void* member, const at::Tensor& input, const at::Tensor& rows,
                                   TensorScaling& scaling, bool with_transposed) {
  if (input.is_inference()) return scaling.cast(rows, with_transposed);
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
  Float8Tensor result = scaling.cast(rows, with_transposed);
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
  const auto shared = std::make_shared<detail::SharedInputCast>(layers.size());
  for (Float8LinearImpl* layer : layers) detail::Float8LinearAccess::shared_input(*layer) = shared;
}

}  // namespace float8
}  // namespace ddp
