#include <ddp/versions.h>

#include <fmt/format.h>

#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include "compat/torch_compat.h"

#if defined(DDP_WITH_CUDA)
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace ddp {
namespace {

#if defined(DDP_WITH_CUDA)
/// CUDA's integer codes: major * 1000 + minor * 10.
std::string cuda_version(int code) { return code <= 0 ? "" : fmt::format("{}.{}", code / 1000, code % 1000 / 10); }
#endif

/// cuDNN's: major * 10000 + minor * 100 + patch since 9, major * 1000 + minor * 100 before.
std::string cudnn_version(long code) {
  if (code <= 0) return "";
  if (code >= 90000) return fmt::format("{}.{}.{}", code / 10000, code % 10000 / 100, code % 100);
  return fmt::format("{}.{}.{}", code / 1000, code % 1000 / 100, code % 100);
}

/// LibTorch without CUDA answers cuDNN queries with an error: no cuDNN then.
template <typename Query>
std::string cudnn_of(Query query) {
  try {
    return cudnn_version(query(at::detail::getCUDAHooks()));
  } catch (const c10::Error&) {
    return "";
  }
}

}  // namespace

Versions versions() {
  Versions v;
  v.libddp = DDP_PROJECT_VERSION;
  v.libtorch = TORCH_VERSION;
  v.cudnn_compiled = cudnn_of([](const at::CUDAHooksInterface& hooks) { return hooks.versionCuDNN(); });
#if DDP_TORCH_HAS_RUNTIME_CUDNN_VERSION
  v.cudnn_runtime = cudnn_of([](const at::CUDAHooksInterface& hooks) { return hooks.versionRuntimeCuDNN(); });
#endif
#if defined(DDP_WITH_CUDA)
  v.cuda_compiled = cuda_version(CUDART_VERSION);
  int code = 0;
  if (cudaRuntimeGetVersion(&code) == cudaSuccess) v.cuda_runtime = cuda_version(code);
  code = 0;
  if (cudaDriverGetVersion(&code) == cudaSuccess) v.cuda_driver = cuda_version(code);
  v.nccl_compiled = fmt::format("{}.{}.{}", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  code = 0;
  if (ncclGetVersion(&code) == ncclSuccess) {
    v.nccl_runtime = fmt::format("{}.{}.{}", code / 10000, code % 10000 / 100, code % 100);
  }
#endif
#if defined(DDP_WITH_GLOO)
  v.gloo = true;
#endif
  return v;
}

}  // namespace ddp
