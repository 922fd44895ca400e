#include "reducer/buffer_sync.h"

#include <map>
#include <string>
#include <tuple>
#include <unordered_set>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "reducer/row_major.h"

namespace ddp::detail {

BufferSync::BufferSync(std::vector<at::Tensor> buffers) {
  // A buffer registered under two submodules is one tensor; flattened twice,
  // its first place would never match again and every forward re-flatten.
  std::unordered_set<const c10::TensorImpl*> seen;
  for (at::Tensor& buffer : buffers) {
    if (seen.insert(buffer.unsafeGetTensorImpl()).second) buffers_.push_back(std::move(buffer));
  }
  flatten();
}

void BufferSync::flatten() {
  c10::NoGradGuard no_grad;
  std::map<std::tuple<int, std::string>, std::vector<std::size_t>> by_kind;
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    by_kind[{static_cast<int>(buffers_[i].scalar_type()), buffers_[i].device().str()}].push_back(i);
  }
  groups_.clear();
  data_.assign(buffers_.size(), nullptr);
  numel_.assign(buffers_.size(), 0);
  for (auto& [kind, members] : by_kind) {
    std::int64_t total = 0;
    for (std::size_t i : members) total += buffers_[i].numel();
    Group group{at::empty({total}, buffers_[members.front()].options()), members};
    std::int64_t offset = 0;
    for (std::size_t i : members) {
      at::Tensor& buffer = buffers_[i];
      const std::int64_t numel = buffer.numel();
      group.flat.narrow(0, offset, numel).copy_(buffer.reshape({-1}));
      // The module holds this same tensor, so it sees the new storage.
      buffer.set_(group.flat.storage(), group.flat.storage_offset() + offset, buffer.sizes(),
                  row_major_strides(buffer.sizes()));
      data_[i] = buffer.data_ptr();
      numel_[i] = numel;
      offset += numel;
    }
    groups_.push_back(std::move(group));
  }
}

bool BufferSync::still_views() const {
  for (const auto& group : groups_) {
    for (std::size_t i : group.members) {
      // A buffer grown in place (resize_) keeps its pointer but would spill
      // into its neighbour's place.
      const at::Tensor& buffer = buffers_[i];
      if (!buffer.is_alias_of(group.flat) || buffer.data_ptr() != data_[i] || buffer.numel() != numel_[i]) return false;
    }
  }
  return true;
}

void BufferSync::broadcast(Communicator& comm, int root) {
  if (!still_views()) flatten();
  for (auto& group : groups_) comm.broadcast(group.flat, root)->wait_stream();
  // The broadcast writes them behind autograd's back; as copy_ would, mark
  // them changed so that a graph that saved one notices.
  for (at::Tensor& buffer : buffers_) buffer.unsafeGetTensorImpl()->bump_version();
}

}  // namespace ddp::detail
