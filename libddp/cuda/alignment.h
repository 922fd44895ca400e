#pragma once

// Whether a pointer sits on a boundary: host code choosing a kernel's path
// (or copying a tensor to an aligned place) and device code choosing packs
// ask the same question. No CUDA headers: host code includes it.

#include <cstdint>

#ifdef __CUDACC__
#define DDP_HOST_DEVICE __host__ __device__
#else
#define DDP_HOST_DEVICE
#endif

namespace ddp::detail {

/// Whether `pointer` is a multiple of `bytes`: whether packs that wide may be
/// read or written there.
DDP_HOST_DEVICE inline bool aligned(const void* pointer, std::uintptr_t bytes) {
  return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0;
}

}  // namespace ddp::detail

#undef DDP_HOST_DEVICE
