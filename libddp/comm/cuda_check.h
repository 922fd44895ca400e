#pragma once

// Every CUDA and NCCL return code is checked; a failure names the call.

#include <stdexcept>
#include <string>

#include <cuda_runtime_api.h>
#include <nccl.h>

namespace ddp::detail {

inline void check_cuda(cudaError_t result, const char* call) {
  if (result != cudaSuccess) {
    throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorName(result) + ": " +
                             cudaGetErrorString(result));
  }
}

/// ncclInProgress is not a failure: non-blocking communicators return it
/// while an operation is still being set up.
inline void check_nccl(ncclResult_t result, const char* call, ncclComm_t comm) {
  if (result != ncclSuccess && result != ncclInProgress) {
    std::string message = std::string(call) + " failed: " + ncclGetErrorString(result);
    const char* last = comm != nullptr ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
    if (last != nullptr && *last != '\0') message += std::string(" (") + last + ")";
    throw std::runtime_error(message);
  }
}

}  // namespace ddp::detail

#define DDP_CUDA_CHECK(call) ::ddp::detail::check_cuda((call), #call)
#define DDP_NCCL_CHECK(call, comm) ::ddp::detail::check_nccl((call), #call, (comm))
