#pragma once

// Every cuDNN return code is checked; a failure names the call and where it
// was made (as cuda_check.h does for CUDA's). Only where libddp is built with
// cuDNN (DDP_WITH_CUDNN).

#include <stdexcept>
#include <string>

#include <cudnn.h>

namespace ddp::detail {

inline void check_cudnn(cudnnStatus_t status, const char* call, const char* file, int line) {
  if (status != CUDNN_STATUS_SUCCESS) {
    throw std::runtime_error(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                             cudnnGetErrorString(status));
  }
}

}  // namespace ddp::detail

#define DDP_CUDNN_CHECK(call) ::ddp::detail::check_cudnn((call), #call, __FILE__, __LINE__)
