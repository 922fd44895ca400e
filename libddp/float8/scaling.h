#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>

#include <ddp/float8.h>

#include "float8/kernels.h"

namespace ddp::detail {

/// Delayed scaling's state of one tensor role, shared by the layer and the
/// copies of its TensorScaling that forward saves for backward.
struct DelayedScalingState : torch::CustomClassHolder {
  at::Tensor amax_history;    // [amax_history_len] fp32, newest first
  at::Tensor scale;           // 0-dim fp32
  at::Tensor pending_amax;    // 0-dim fp32: the amax of the casts since the last commit, zero after one
  bool amax_pending = false;  // whether pending_amax waits to enter the history
  float scale_target = 0;     // what the history's amax maps to: the format's largest value / 2^margin
  bool use_max = true;        // the history's amax is its maximum; false: its newest entry
  // A cast written by another kernel (TensorScaling::offer), waiting for the
  // layer to take it: the placeholder tensor the layer will be handed, held
  // so that its address cannot pass for another tensor's meanwhile.
  at::Tensor offered_for;
  Float8Tensor offered;
  // A weight's cast that the optimizer wrote as it updated the weight
  // (float8/weight_cast.h), not yet taken by a forward: its amax is in
  // pending_amax but not pending (amax_pending false), so that a checkpoint
  // or a commit before the forward sees no cast the forward has not done.
  bool weight_cast_offered = false;
};

/// The scaling of one tensor role of a layer (input, weight or output
/// gradient). A value type: copies share the delayed-scaling state, so a
/// copy saved for backward updates the layer's state.
///
/// Under delayed scaling a cast takes its tensor's amax into a pending
/// amax, which enters the history (and changes the scale) at the next
/// commit: TensorScaling::commit_pending_amaxes() commits a whole model's in a few launches
/// once per iteration; a cast commits its own predecessor's if no such
/// commit came between them, so each cast still sees every earlier amax.
class TensorScaling {
 public:
  TensorScaling() = default;
  TensorScaling(const Float8Options& options, c10::ScalarType float8_dtype, const c10::Device& device);

  /// Casts the matrix `tensor` to FP8 with a scale that maps its amax
  /// (current scaling) or the amax of the history (delayed) to the format's
  /// largest value; delayed, the tensor's amax becomes pending.
  /// with_transposed: also gives the transpose, written in the same pass on
  /// the GPU; with_data false leaves out the row-major copy (on the GPU)
  /// where only the transpose is needed.
  Float8Tensor cast(const at::Tensor& tensor, bool with_transposed = false, bool with_data = true);

  /// Delayed scaling, for a kernel that computes this role's tensor and
  /// writes its FP8 cast itself (float8/tile.cuh) instead of a bf16 tensor
  /// for cast() to read again: the cast of a [rows, cols] matrix to fill,
  /// with its FP8 data and transpose allocated, the scale to cast with and
  /// the pending amax to max-accumulate into. Commits a pending amax first,
  /// as cast() does.
  Float8Tensor destination(std::int64_t rows, std::int64_t cols);
  /// After that kernel ran: its amax is pending, and the cast waits for the
  /// layer. Returns what to hand the layer in place of the tensor (its input,
  /// or the gradient of its output): a tensor of `sizes` and `dtype` that
  /// holds no values (one element, zero strides); the layer finds the cast
  /// by it and never reads it.
  at::Tensor offer(const Float8Tensor& written, at::IntArrayRef sizes, c10::ScalarType dtype);
  /// The cast offered for `tensor`, removed; nullopt where none waits.
  /// UsageError where one waits for another tensor: the layer was not given
  /// what the fused kernel returned (the offer is dropped).
  std::optional<Float8Tensor> take_offered(const at::Tensor& tensor, const char* role);

  // The weight's cast written by the optimizer (float8/weight_cast.h), in
  // three steps: prepare_weight_cast() before the step, weight_cast_written()
  // after it, take_weight_cast() in the next forward; withdraw_weight_cast()
  // where anything else comes first.

  /// Points `into` (data and transposed allocated by the caller) at the
  /// scale to cast with and the amax to accumulate into, withdrawing an
  /// untaken cast first. False where an amax is pending: then the forward's
  /// cast would commit it first and see another scale (an iteration that
  /// commits its amaxes after the optimizer step).
  bool prepare_weight_cast(Float8Tensor& into);
  void weight_cast_written() { state_->weight_cast_offered = true; }
  /// Whether a written cast waits; takes it, its amax becoming pending as a
  /// cast's does.
  bool take_weight_cast();
  /// Drops a written cast that no forward took: its amax leaves pending_amax.
  void withdraw_weight_cast();
  bool weight_cast_offered() const { return delayed() && state_->weight_cast_offered; }

  /// Delayed scaling: enters a pending amax into the history and recomputes
  /// the scale (withdrawing an untaken weight cast first); no-op when none is
  /// pending, or under current scaling.
  void commit_pending_amax();
  /// Delayed scaling: the newest entry of the amax history (a view), after
  /// committing a pending amax; and the recomputation of the scale from the
  /// history (after it was reduced across ranks). Undefined / no-op for
  /// current scaling.
  at::Tensor latest_amax();
  void refresh_scale();
  /// Moves the delayed-scaling state to `device`.
  void to(const c10::Device& device);
  /// A scaling of the same recipe with a copy of this one's delayed-scaling
  /// state (amax history, scale, pending amax): committing the copy shows
  /// what a commit would leave and leaves this state alone. Current scaling:
  /// a plain copy.
  TensorScaling with_copied_state() const;

  bool delayed() const { return options_.scaling() == Float8Scaling::kDelayed; }
  bool amax_pending() const { return delayed() && state_->amax_pending; }
  at::Tensor& amax_history() { return state_->amax_history; }
  at::Tensor& scale() { return state_->scale; }
  at::Tensor& pending_amax() { return state_->pending_amax; }

  /// Carries the scaling into an autograd context and back, for backward.
  void save_to(torch::autograd::AutogradContext* context, const std::string& prefix) const;
  static TensorScaling load_from(torch::autograd::AutogradContext* context, const std::string& prefix);

  /// Many commits at once: every delayed scaling of `scalings` takes
  /// amaxes[i] as its newest amax (pending or not) when `amaxes` is given
  /// ([n] fp32 on their device: the pending amaxes reduced across ranks);
  /// without it, those with a pending amax commit it. On the GPU this is a
  /// few launches for a whole model, where a commit per cast is one each.
  static void commit_pending_amaxes(const std::vector<TensorScaling*>& scalings, const at::Tensor& amaxes = {});

 private:
  /// The commit (or, with `amax` undefined, the refresh) by ATen's ops, for
  /// CPU tensors and builds without the CUDA kernels.
  static void update_history_with_aten(DelayedScalingState& state, const at::Tensor& amax);

  Float8Options options_;
  c10::ScalarType float8_dtype_ = c10::ScalarType::Undefined;
  c10::intrusive_ptr<DelayedScalingState> state_;  // null for current scaling
};

}  // namespace ddp::detail
