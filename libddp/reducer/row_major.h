#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

namespace ddp::detail {

/// Strides of a contiguous tensor of `sizes`, for laying tensors out in a flat buffer.
inline std::vector<std::int64_t> row_major_strides(c10::IntArrayRef sizes) {
  std::vector<std::int64_t> strides(sizes.size(), 1);
  for (std::size_t i = sizes.size(); i-- > 1;) strides[i - 1] = strides[i] * std::max<std::int64_t>(sizes[i], 1);
  return strides;
}

/// Strides of `parameter`'s place in a flat buffer: its own when it is dense
/// (channels_last stays channels_last, so a gradient laid out as autograd
/// lays it out matches its slice element for element), else row-major.
std::vector<std::int64_t> flat_layout_strides(const at::Tensor& parameter);

/// Whether `strides` and `other` lay a tensor of `sizes` out alike. Strides
/// of dimensions of size 1 are not compared: they address nothing, and
/// kernels choose them differently: a 1x1 convolution's weight made
/// channels_last by contiguous(ChannelsLast) keeps (C, 1, 1, 1), where cuDNN
/// writes its gradient as (C, 1, C, C). Autograd's layout contract ignores
/// them too.
bool same_strides_where_addressed(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::IntArrayRef other);

/// Whether `tensor` is dense and lays its elements out in memory as `view`
/// does (same_strides_where_addressed), so that each is copied as the other's
/// memory.
bool same_memory_layout(const at::Tensor& tensor, const at::Tensor& view);

/// A tensor of `sizes` and `strides` over `base`'s memory from element
/// `offset` on. Not an autograd view: optimizers, detach_() and set_() treat
/// it as a tensor of its own.
at::Tensor alias(const at::Tensor& base, std::int64_t offset, c10::IntArrayRef sizes, c10::IntArrayRef strides);

}  // namespace ddp::detail
