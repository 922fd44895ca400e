#pragma once

// One FP8 cast of an input that several Float8Linear layers read (attention's
// query, key and value projections; SwiGLU's gate and up projections): the
// first of them to run casts it, the others reuse that cast.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include "float8/scaling.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace ddp::detail {

/// The cast a group of layers shares; see float8::share_input_cast().
class SharedInputCast {
 public:
  explicit SharedInputCast(const std::vector<Float8LinearImpl*>& layers);

  /// The group's layers, or none where one of them is gone or has left the
  /// group (reset()): the caller keeps them alive while it looks at them.
  std::vector<std::shared_ptr<Float8LinearImpl>> layers() const;

  /// A fused kernel wrote the cast of `placeholder` (a tensor that holds no
  /// values) for `taker`, which takes it by its own offer
  /// (TensorScaling::offer): the other members find it here, as if `taker`
  /// had cast it, whichever of them runs first.
  void expect(const at::Tensor& placeholder, const Float8Tensor& cast, const void* taker);

  /// The cast of `input` (as a matrix of its rows) for `member`: the cached
  /// one where `input` is the tensor cast last (the same tensor, unchanged
  /// since: same version), `member` has not used that cast yet, and it holds
  /// the transpose if asked for; otherwise a new cast by `scaling`, the
  /// member's, kept for the other members. The cache is dropped once every
  /// member has used it, so it holds no memory past the group's forward.
  /// Inference tensors have no version to tell a change by: they are always
  /// cast anew. UsageError for the placeholder of expect() where the cache
  /// no longer holds its cast for `member`: it has no values to cast.
  Float8Tensor cast(const void* member, const at::Tensor& input, TensorScaling& scaling, bool with_transposed);

 private:
  std::size_t members_;
  // Weak: the layers own the group, not the other way round.
  std::vector<std::weak_ptr<torch::nn::Module>> layers_;
  // A weak reference: the cache keeps no input alive, and a freed input's
  // address cannot pass for a new tensor's while the reference exists.
  std::optional<c10::weak_intrusive_ptr<c10::TensorImpl>> source_;
  // The last placeholder expect() was given, weakly as source_.
  std::optional<c10::weak_intrusive_ptr<c10::TensorImpl>> placeholder_;
  std::int64_t source_version_ = 0;
  Float8Tensor cached_;
  std::vector<const void*> users_;  // the members that have used cached_
};

}  // namespace ddp::detail
