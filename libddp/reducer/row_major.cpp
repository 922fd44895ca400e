#include "reducer/row_major.h"

#include <ATen/ATen.h>

namespace ddp::detail {

std::vector<std::int64_t> flat_layout_strides(const at::Tensor& parameter) {
  return parameter.is_non_overlapping_and_dense() ? parameter.strides().vec() : row_major_strides(parameter.sizes());
}

bool same_strides_where_addressed(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::IntArrayRef other) {
  if (strides.size() != sizes.size() || other.size() != sizes.size()) return false;
  for (std::size_t dim = 0; dim < sizes.size(); ++dim) {
    if (sizes[dim] != 1 && strides[dim] != other[dim]) return false;
  }
  return true;
}

bool same_memory_layout(const at::Tensor& tensor, const at::Tensor& view) {
  return tensor.sizes() == view.sizes() && tensor.is_non_overlapping_and_dense() &&
         same_strides_where_addressed(tensor.sizes(), tensor.strides(), view.strides());
}

at::Tensor alias(const at::Tensor& base, std::int64_t offset, c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  return at::empty({0}, base.options()).set_(base.storage(), base.storage_offset() + offset, sizes, strides);
}

}  // namespace ddp::detail
