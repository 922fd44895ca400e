#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include <ddp/communicator.h>
#include <ddp/errors.h>

namespace ddp {

std::string to_string(Backend backend) { return backend == Backend::kNccl ? "nccl" : "gloo"; }

Backend parse_backend(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "nccl") return Backend::kNccl;
  if (lower == "gloo") return Backend::kGloo;
  throw UsageError(fmt::format("unknown backend '{}': use 'nccl' (CUDA tensors) or 'gloo' (CPU tensors)", name));
}

bool is_available(Backend backend) {
  switch (backend) {
    case Backend::kNccl:
#ifdef DDP_WITH_NCCL
      return true;
#else
      return false;
#endif
    case Backend::kGloo:
#ifdef DDP_WITH_GLOO
      return true;
#else
      return false;
#endif
  }
  return false;
}

std::string to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
  }
  return "?";
}

}  // namespace ddp
