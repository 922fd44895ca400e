#pragma once

// One FP8 cast of an input that several Float8Linear layers read (attention's
// query, key and value projections; SwiGLU's gate and up projections): the
// first of them to run casts it, the others reuse that cast.

#include <cstddef>
#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include "precision/float8_scaling.h"

namespace ddp::detail {

/// The cast a group of layers shares; see float8::share_input_cast().
class SharedInputCast {
 public:
  explicit SharedInputCast(std::size_t members) : members_(members) {}

  /// The cast of `input` (as the matrix `rows`) for one member: the cached
  /// one where `input` is the tensor cast last (the same tensor, unchanged
  /// since: same version) and the cache holds the transpose if asked for;
  /// otherwise a new cast by `scaling`, the caller's, kept for the other
  /// members. The cache is dropped once every other member has used it, so
  /// it holds no memory past the group's forward.
  Float8Tensor cast(const at::Tensor& input, const at::Tensor& rows, TensorScaling& scaling, bool with_transposed);

 private:
  std::size_t members_;
  // A weak reference: the cache keeps no input alive, and a freed input's
  // address cannot pass for a new tensor's while the reference exists.
  std::optional<c10::weak_intrusive_ptr<c10::TensorImpl>> source_;
  std::int64_t source_version_ = 0;
  Float8Tensor cached_;
  std::size_t uses_left_ = 0;
};

}  // namespace ddp::detail
