#include "reducer/row_major.h"

#include <ATen/ATen.h>

namespace ddp::detail {

std::vector<std::int64_t> flat_layout_strides(const at::Tensor& parameter) {
  return parameter.is_non_overlapping_and_dense() ? parameter.strides().vec() : row_major_strides(parameter.sizes());
}

at::Tensor alias(const at::Tensor& base, std::int64_t offset, c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  return at::empty({0}, base.options()).set_(base.storage(), base.storage_offset() + offset, sizes, strides);
}

}  // namespace ddp::detail
