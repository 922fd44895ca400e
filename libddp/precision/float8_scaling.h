#pragma once

#include <string>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>

#include <ddp/float8.h>

namespace ddp::detail {

/// An FP8 matrix with the factor that turns it back into real values (what
/// at::_scaled_mm calls its scale). at::_scaled_mm takes its first operand
/// row-major and its second column-major, and Float8Linear needs each cast
/// matrix in both roles, so a cast can also give the transpose.
struct Float8Tensor {
  at::Tensor data;        // [M, K] row-major
  at::Tensor transposed;  // [K, M] row-major (data in column-major order), if asked for
  at::Tensor inverse_scale;
};

/// The scaling of one tensor role of a layer (input, weight or output
/// gradient). A value type: copies share the delayed-scaling state, so a
/// copy saved for backward updates the layer's state.
class TensorScaling {
 public:
  TensorScaling() = default;
  TensorScaling(const Float8Options& options, c10::ScalarType float8_dtype, const c10::Device& device);

  /// Casts the matrix `tensor` to FP8 with a scale that maps its amax
  /// (current scaling) or the amax of the history (delayed) to the format's
  /// largest value, and records the amax in the history. with_transposed:
  /// also gives the transpose, written in the same pass on the GPU;
  /// with_data false leaves out the row-major copy (on the GPU) where only
  /// the transpose is needed.
  Float8Tensor cast(const at::Tensor& tensor, bool with_transposed = false, bool with_data = true);

  /// Delayed scaling: the newest entry of the amax history (a view), and the
  /// recomputation of the scale from the history. Undefined / no-op for
  /// current scaling.
  at::Tensor latest_amax() const;
  void refresh_scale();
  /// Moves the delayed-scaling state to `device`.
  void to(const c10::Device& device);

  bool delayed() const { return options_.scaling() == Float8Scaling::kDelayed; }
  bool use_max() const { return options_.amax_compute() == AmaxCompute::kMax; }
  at::Tensor& amax_history() { return amax_history_; }
  at::Tensor& scale() { return scale_; }

  /// Carries the scaling into an autograd context and back, for backward.
  void save_to(torch::autograd::AutogradContext* context, const std::string& prefix) const;
  static TensorScaling load_from(torch::autograd::AutogradContext* context, const std::string& prefix);

 private:
  /// What delayed scaling's amax maps to: the largest finite value / 2^margin.
  double scale_target() const;

  Float8Options options_;
  c10::ScalarType float8_dtype_ = c10::ScalarType::Undefined;
  at::Tensor amax_history_;  // [amax_history_len] fp32, newest first
  at::Tensor scale_;         // 0-dim fp32
  at::Tensor pending_amax_;  // 0-dim fp32: the cast kernel's amax, zero between casts
};

}  // namespace ddp::detail
