#include <ddp/precision.h>

#include <algorithm>
#include <array>
#include <cctype>

#include <fmt/format.h>

#include <ddp/errors.h>

#include "float8/support.h"

namespace ddp {
namespace {

constexpr std::array<std::pair<const char*, Precision>, 5> kNames{{
    {"fp32", Precision::kFp32},
    {"tf32", Precision::kTf32},
    {"bf16", Precision::kBf16},
    {"fp16", Precision::kFp16},
    {"fp8", Precision::kFp8},
}};

}  // namespace

std::string to_string(Precision precision) {
  for (const auto& [name, value] : kNames) {
    if (value == precision) return name;
  }
  return "unknown";
}

Precision parse_precision(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const auto& [candidate, value] : kNames) {
    if (lower == candidate) return value;
  }
  throw UsageError(fmt::format("unknown precision '{}': choose one of fp32, tf32, bf16, fp16, fp8", name));
}

PrecisionPolicy::PrecisionPolicy(Precision precision) : precision_(precision) {}

PrecisionPolicy PrecisionPolicy::parse(const std::string& name) { return PrecisionPolicy(parse_precision(name)); }

std::optional<c10::ScalarType> PrecisionPolicy::autocast_dtype() const {
  switch (precision_) {
    case Precision::kBf16:
    case Precision::kFp8:
      return c10::ScalarType::BFloat16;
    case Precision::kFp16:
      return c10::ScalarType::Half;
    default:
      return std::nullopt;
  }
}

PrecisionPolicy& PrecisionPolicy::gradient_reduce_dtype(c10::ScalarType dtype) {
  if (dtype != c10::ScalarType::Float && dtype != c10::ScalarType::BFloat16 && dtype != c10::ScalarType::Half) {
    throw UsageError(fmt::format("gradient_reduce_dtype must be fp32, bf16 or fp16, got {}", c10::toString(dtype)));
  }
  gradient_reduce_dtype_ = dtype;
  return *this;
}

void PrecisionPolicy::check_supported(c10::Device device) const {
  if ((precision_ == Precision::kFp16 || precision_ == Precision::kFp8) && !device.is_cuda()) {
    throw UsageError(fmt::format("precision {} needs a CUDA device, got {}; on the CPU use bf16 or fp32",
                                 to_string(precision_), device.str()));
  }
  if (precision_ == Precision::kFp8) detail::check_float8_supported(device);
}

}  // namespace ddp
