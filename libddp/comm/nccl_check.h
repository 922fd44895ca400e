#pragma once

// Every NCCL return code is checked; a failure names the call and NCCL's own
// last error.

#include <stdexcept>
#include <string>

#include <nccl.h>

namespace ddp::detail {

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

#define DDP_NCCL_CHECK(call, comm) ::ddp::detail::check_nccl((call), #call, (comm))
