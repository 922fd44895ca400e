#pragma once

// Every CUDA return code is checked; a failure names the call and where it
// was made. CUDA only: the FP8 kernels include it
// without NCCL (comm/nccl_check.h checks NCCL's).

#include <stdexcept>
#include <string>

#include <cuda_runtime_api.h>

namespace ddp::detail {

inline void check_cuda(cudaError_t result, const char* call, const char* file, int line) {
  if (result != cudaSuccess) {
    throw std::runtime_error(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                             cudaGetErrorName(result) + ": " + cudaGetErrorString(result));
  }
}

}  // namespace ddp::detail

#define DDP_CUDA_CHECK(call) ::ddp::detail::check_cuda((call), #call, __FILE__, __LINE__)
/// Right after a kernel launch, so that a bad launch configuration is reported
/// with the kernel's name here rather than by the next call that syncs.
#define DDP_CUDA_CHECK_LAUNCH(kernel_name) \
  ::ddp::detail::check_cuda(cudaGetLastError(), kernel_name "<<<...>>>", __FILE__, __LINE__)
