#pragma once

#include <cstddef>
#include <vector>

#include <ATen/core/Tensor.h>

namespace ddp::detail {

/// Groups tensors into buckets, as PyTorch's compute_bucket_assignment_by_size:
/// tensors are taken in `order`, only tensors of one dtype and device share a
/// bucket, the first bucket of each (dtype, device) closes at `first_cap_bytes`
/// and later ones at `cap_bytes`. Buckets come out sorted by the position of
/// their first tensor in `order`, which is the order they are reduced in.
/// Unlike PyTorch, the last bucket is also cut to about `first_cap_bytes`: its
/// reduction is the one left to do after backward ends, so it should be short.
/// Returns, per bucket, indices into `tensors`.
std::vector<std::vector<std::size_t>> assign_buckets(const std::vector<at::Tensor>& tensors,
                                                     const std::vector<std::size_t>& order,
                                                     std::size_t first_cap_bytes, std::size_t cap_bytes);

/// The buckets before any gradient was seen: gradients become ready roughly
/// in reverse order of registration (the last layers first), so that order.
std::vector<std::vector<std::size_t>> initial_buckets(const std::vector<at::Tensor>& tensors,
                                                      std::size_t first_cap_bytes, std::size_t cap_bytes);

}  // namespace ddp::detail
