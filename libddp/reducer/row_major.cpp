#include "reducer/row_major.h"

#include <ATen/ATen.h>

namespace ddp::detail {

std::vector<std::int64_t> flat_layout_strides(const at::Tensor& parameter) {
  return parameter.is_non_overlapping_and_dense() ? parameter.strides().vec() : row_major_strides(parameter.sizes());
}

bool same_memory_layout(const at::Tensor& tensor, const at::Tensor& view) {
  if (tensor.sizes() != view.sizes() || !tensor.is_non_overlapping_and_dense()) return false;
  for (std::int64_t dim = 0; dim < tensor.dim(); ++dim) {
    if (tensor.size(dim) != 1 && tensor.stride(dim) != view.stride(dim)) return false;
  }
  return true;
}

at::Tensor alias(const at::Tensor& base, std::int64_t offset, c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  return at::empty({0}, base.options()).set_(base.storage(), base.storage_offset() + offset, sizes, strides);
}

}  // namespace ddp::detail
