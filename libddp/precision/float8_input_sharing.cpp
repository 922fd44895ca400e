#include "precision/float8_input_sharing.h"

#include <memory>
#include <string>
#include <vector>

#include <ddp/errors.h>
#include <ddp/float8.h>

namespace ddp {
namespace detail {

Float8Tensor SharedInputCast::cast(const at::Tensor& input, const at::Tensor& rows, TensorScaling& scaling,
                                   bool with_transposed) {
  const bool cached = uses_left_ > 0 && source_ && source_->lock().get() == input.unsafeGetTensorImpl() &&
                      source_version_ == static_cast<std::int64_t>(input._version()) &&
                      (!with_transposed || cached_.transposed.defined());
  if (cached) {
    Float8Tensor result = cached_;
    if (--uses_left_ == 0) {
      cached_ = Float8Tensor{};
      source_.reset();
    }
    return result;
  }
  Float8Tensor result = scaling.cast(rows, with_transposed);
  uses_left_ = members_ - 1;
  if (uses_left_ > 0) {
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
                       std::to_string(layer->options.in_features()) + "); only layers called with the same input "
                       "tensor can share its cast");
    }
  }
  const auto shared = std::make_shared<detail::SharedInputCast>(layers.size());
  for (Float8LinearImpl* layer : layers) detail::shared_input_cast(*layer) = shared;
}

}  // namespace float8
}  // namespace ddp
