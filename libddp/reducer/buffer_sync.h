#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include <ddp/communicator.h>

namespace ddp::detail {

/// Gives every rank rank 0's module buffers (BatchNorm statistics) before
/// each training forward, as PyTorch DDP's broadcast_buffers does, without
/// copying them: the buffers are made views of one flat tensor per dtype,
/// which is broadcast in place. Concatenating them and copying every one
/// back would cost a kernel per buffer on every rank, each forward (161 for
/// ResNet-50). A buffer that stopped being such a view (load() or to()
/// replace its storage, resize_ changed its size) is noticed before the
/// next broadcast, and the flat tensors are rebuilt. A buffer grown in place
/// shares its neighbour's memory until then: replace a buffer (set_ or
/// assignment) rather than resize_ it.
class BufferSync {
 public:
  explicit BufferSync(std::vector<at::Tensor> buffers);

  /// Collective; returns when the current stream is ordered after the broadcast.
  void broadcast(Communicator& comm, int root);

 private:
  struct Group {
    at::Tensor flat;
    std::vector<std::size_t> members;  // indices into buffers_
  };

  void flatten();
  bool still_views() const;

  std::vector<at::Tensor> buffers_;
  std::vector<Group> groups_;
  std::vector<const void*> data_;       // where each buffer's data was put
  std::vector<std::int64_t> numel_;     // and how many elements it had
};

}  // namespace ddp::detail
