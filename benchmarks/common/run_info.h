#pragma once

// What every benchmark result records about its run: GPU, date, commit.

#include <cstdlib>
#include <ctime>
#include <string>

#include <cuda_runtime_api.h>

namespace bench {

struct RunInfo {
  std::string gpu;     ///< Device name, e.g. "NVIDIA H200".
  std::string date;    ///< UTC, minutes.
  std::string commit;  ///< From DDP_GIT_COMMIT (set by cmake/scripts/gpu_check.sh), else "unknown".
};

inline RunInfo run_info(int device_index) {
  RunInfo info;
  cudaDeviceProp prop;
  info.gpu = cudaGetDeviceProperties(&prop, device_index) == cudaSuccess ? prop.name : "unknown GPU";
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  info.date = date;
  const char* commit = std::getenv("DDP_GIT_COMMIT");
  info.commit = commit ? commit : "unknown";
  return info;
}

}  // namespace bench
