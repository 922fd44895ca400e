#pragma once

// A plain struct as the bytes of one store record, and back with its size
// checked: how the NCCL id and the copy-engine staging areas travel between
// the ranks of a job.

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include <ddp/errors.h>

namespace ddp::detail {

template <typename T>
std::vector<std::uint8_t> store_record(const T& value) {
  static_assert(std::is_trivially_copyable_v<T>);
  const auto* first = reinterpret_cast<const std::uint8_t*>(&value);
  return {first, first + sizeof(T)};
}

/// Throws Error "libddp: `malformed` (N bytes instead of M)" unless `bytes`
/// hold exactly one T.
template <typename T>
T from_store_record(const std::vector<std::uint8_t>& bytes, const std::string& malformed) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (bytes.size() != sizeof(T)) {
    throw Error(fmt::format("libddp: {} ({} bytes instead of {})", malformed, bytes.size(), sizeof(T)));
  }
  T value;
  std::memcpy(&value, bytes.data(), sizeof(T));
  return value;
}

}  // namespace ddp::detail
