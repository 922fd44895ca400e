#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <c10/util/ArrayRef.h>

namespace ddp::detail {

/// Strides of a contiguous tensor of `sizes`, for laying tensors out in a flat buffer.
inline std::vector<std::int64_t> row_major_strides(c10::IntArrayRef sizes) {
  std::vector<std::int64_t> strides(sizes.size(), 1);
  for (std::size_t i = sizes.size(); i-- > 1;) strides[i - 1] = strides[i] * std::max<std::int64_t>(sizes[i], 1);
  return strides;
}

}  // namespace ddp::detail
