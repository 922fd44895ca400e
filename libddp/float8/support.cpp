#include "float8/support.h"

#include <fmt/format.h>

#include <ddp/errors.h>

#include "compat/torch_compat.h"

#ifdef DDP_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/cuda_check.h"
#endif

namespace ddp::detail {

void check_float8_supported(c10::Device device) {
#if !DDP_TORCH_HAS_SCALED_MM
  (void)device;
  throw UsageError(
      fmt::format("fp8 needs LibTorch >= 2.4 (for at::_scaled_mm); this libddp was built against "
                  "LibTorch {}. Use bf16, or rebuild against a newer LibTorch",
                  TORCH_VERSION));
#else
  if (!device.is_cuda()) {
    throw UsageError(fmt::format("fp8 matmuls need a CUDA GPU, got device {}; use bf16 on the CPU", device.str()));
  }
#ifdef DDP_WITH_CUDA
  int index = device.has_index() ? device.index() : -1;
  if (index < 0) DDP_CUDA_CHECK(cudaGetDevice(&index));
  cudaDeviceProp properties{};
  DDP_CUDA_CHECK(cudaGetDeviceProperties(&properties, index));
  const int capability = properties.major * 10 + properties.minor;
  if (capability < 89) {
    throw UsageError(
        fmt::format("fp8 needs a GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell); "
                    "GPU {} ({}) is sm_{}. Use bf16 on this GPU",
                    index, properties.name, capability));
  }
#else
  throw UsageError("fp8 needs libddp built with CUDA; this build has none");
#endif
#endif
}

}  // namespace ddp::detail
