// float8::output_gradient_destination and output_gradient_written: the hook
// by which a kernel outside libddp (an application's fused backward, LLaMA's
// q/k/v rotation) writes the FP8 gradient of a Float8Linear's output, as
// swiglu_linear's and add_rms_norm's backward do inside it, so that the
// gradient's bf16 tensor and the layer's cast of it do not exist.

#include <ddp/float8.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <ddp/errors.h>

#include "float8/kernels.h"
#include "float8/linear_state.h"

namespace ddp::float8 {

std::optional<Float8Tensor> output_gradient_destination([[maybe_unused]] Float8LinearImpl& layer,
                                                        [[maybe_unused]] std::int64_t rows,
                                                        [[maybe_unused]] std::int64_t cols) {
#ifdef DDP_WITH_CUDA_KERNELS
  detail::TensorScaling* scaling = detail::Float8LinearAccess::fusable_grad_output_scaling(layer);
  // The layer's FP8 matmuls take rows in sixteens, the byte transpose that
  // completes the cast columns in sixteens.
  if (scaling == nullptr || rows <= 0 || rows % 16 != 0 || cols % 16 != 0 || cols != layer.options.out_features()) {
    return std::nullopt;
  }
  return scaling->destination(rows, cols);
#else
  return std::nullopt;
#endif
}

at::Tensor output_gradient_written([[maybe_unused]] Float8LinearImpl& layer, [[maybe_unused]] const Float8Tensor& cast,
                                   [[maybe_unused]] at::IntArrayRef sizes, [[maybe_unused]] c10::ScalarType dtype) {
#ifdef DDP_WITH_CUDA_KERNELS
  detail::TensorScaling* scaling = detail::Float8LinearAccess::fusable_grad_output_scaling(layer);
  if (scaling == nullptr || !cast.data.defined() || !cast.transposed.defined() || !cast.inverse_scale.defined() ||
      !cast.scale.is_same(scaling->scale())) {
    throw UsageError(fmt::format(
        "float8::output_gradient_written: the cast is not one output_gradient_destination gave for this layer "
        "(Float8Linear({}, {})); write the gradient into the cast it returned",
        layer.options.in_features(), layer.options.out_features()));
  }
  std::int64_t rows = 1;
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) rows *= sizes[i];
  if (sizes.empty() || rows != cast.data.size(0) || sizes.back() != cast.data.size(1)) {
    throw UsageError(fmt::format(
        "float8::output_gradient_written: the gradient's shape {} does not match the cast [{}, {}] it was written "
        "as; pass the shape of the layer's output",
        c10::str(sizes), cast.data.size(0), cast.data.size(1)));
  }
  // The layer's backward multiplies by the inverse scale and reads the
  // transpose for its weight gradient: both follow from what the kernel wrote.
  at::Tensor inverse_scale = cast.inverse_scale;  // a handle: the cast's own tensor is written
  at::reciprocal_out(inverse_scale, cast.scale);
  detail::transpose_float8(cast.data, cast.transposed);
  return scaling->offer(cast, sizes, dtype);
#else
  throw UsageError(
      "float8::output_gradient_written: libddp was built without its CUDA kernels, so "
      "output_gradient_destination gives no cast to write");
#endif
}

}  // namespace ddp::float8
