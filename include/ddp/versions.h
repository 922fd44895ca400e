#pragma once

#include <string>

#include <ddp/export.h>

namespace ddp {

/// What libddp was built with and what this process loaded: a job that
/// mixes them (a driver older than the CUDA runtime, another NCCL found
/// first on the library path) fails in ways that name neither. A field is
/// empty where the build has no such component (no CUDA, no Gloo). Versions
/// read as "major.minor[.patch]".
struct DDP_API Versions {
  std::string libddp;          ///< This library.
  std::string libtorch;        ///< The LibTorch headers libddp was compiled against.
  std::string cuda_compiled;   ///< The CUDA toolkit libddp was compiled with.
  std::string cuda_runtime;    ///< The CUDA runtime loaded.
  std::string cuda_driver;     ///< The newest CUDA the installed driver supports.
  std::string cudnn_compiled;  ///< The cuDNN LibTorch was built with.
  std::string cudnn_runtime;   ///< The cuDNN loaded (LibTorch 2.x; empty on 1.x).
  std::string nccl_compiled;   ///< The NCCL headers libddp was compiled with.
  std::string nccl_runtime;    ///< The NCCL loaded.
  bool gloo = false;           ///< Whether the Gloo backend is built in.
};

/// Reads them; the run-time ones from the loaded libraries (no GPU needed).
DDP_API Versions versions();

}  // namespace ddp
