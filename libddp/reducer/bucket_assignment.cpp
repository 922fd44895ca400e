#include "reducer/bucket_assignment.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>

namespace ddp::detail {
namespace {

std::size_t bytes_of(const std::vector<at::Tensor>& tensors, const std::vector<std::size_t>& indices) {
  std::size_t bytes = 0;
  for (std::size_t index : indices) bytes += static_cast<std::size_t>(tensors[index].numel()) * tensors[index].element_size();
  return bytes;
}

}  // namespace

std::vector<std::vector<std::size_t>> assign_buckets(const std::vector<at::Tensor>& tensors,
                                                     const std::vector<std::size_t>& order,
                                                     std::size_t first_cap_bytes, std::size_t cap_bytes) {
  struct Open {
    std::vector<std::size_t> indices;
    std::size_t bytes = 0;
    bool first = true;  // still filling the first, smaller bucket of this key
  };
  using Key = std::tuple<int, int, int>;  // dtype, device type, device index
  std::map<Key, Open> open;
  std::vector<std::vector<std::size_t>> buckets;
  for (std::size_t index : order) {
    const at::Tensor& tensor = tensors[index];
    const Key key{static_cast<int>(tensor.scalar_type()), static_cast<int>(tensor.device().type()),
                  tensor.device().index()};
    Open& bucket = open[key];
    bucket.indices.push_back(index);
    bucket.bytes += static_cast<std::size_t>(tensor.numel()) * tensor.element_size();
    if (bucket.bytes >= (bucket.first ? first_cap_bytes : cap_bytes)) {
      buckets.push_back(std::move(bucket.indices));
      bucket = Open{{}, 0, false};
    }
  }
  for (auto& [key, bucket] : open) {
    if (!bucket.indices.empty()) buckets.push_back(std::move(bucket.indices));
  }
  std::vector<std::size_t> position(tensors.size());
  for (std::size_t i = 0; i < order.size(); ++i) position[order[i]] = i;
  std::sort(buckets.begin(), buckets.end(), [&](const auto& a, const auto& b) {
    return position[a.front()] < position[b.front()];
  });
  if (!buckets.empty()) {
    std::vector<std::size_t>& last = buckets.back();
    std::size_t tail_bytes = 0;
    std::size_t cut = last.size();
    while (cut > 1 && tail_bytes < first_cap_bytes) {
      --cut;
      tail_bytes += static_cast<std::size_t>(tensors[last[cut]].numel()) * tensors[last[cut]].element_size();
    }
    if (cut > 0 && cut < last.size() && tail_bytes < bytes_of(tensors, last) - tail_bytes) {
      std::vector<std::size_t> tail(last.begin() + static_cast<long>(cut), last.end());
      last.resize(cut);
      buckets.push_back(std::move(tail));
    }
  }
  return buckets;
}

std::vector<std::vector<std::size_t>> initial_buckets(const std::vector<at::Tensor>& tensors,
                                                      std::size_t first_cap_bytes, std::size_t cap_bytes) {
  std::vector<std::size_t> order(tensors.size());
  std::iota(order.rbegin(), order.rend(), 0);
  return assign_buckets(tensors, order, first_cap_bytes, cap_bytes);
}

}  // namespace ddp::detail
