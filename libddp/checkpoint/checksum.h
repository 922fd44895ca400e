#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddp::detail {

/// XXH64 (seed 0) of a byte stream, fed in pieces of any size: a fast,
/// well-specified 64-bit checksum (about as fast as reading memory), so that
/// a checkpoint's damage is found when it is loaded, not as a NaN loss later.
class Xxh64 {
 public:
  void update(const void* data, std::size_t size);
  std::uint64_t digest() const;

 private:
  std::uint64_t lanes_[4] = {0x9E3779B185EBCA87ULL + 0xC2B2AE3D27D4EB4FULL, 0xC2B2AE3D27D4EB4FULL, 0,
                             0 - 0x9E3779B185EBCA87ULL};
  unsigned char pending_[32] = {};
  std::size_t pending_size_ = 0;
  std::uint64_t total_ = 0;
};

/// Seals the file at `path`: appends a trailer holding the XXH64 of its
/// bytes and their count. Throws Error naming the path on an I/O failure.
void seal_file(const std::string& path);

/// Whether the file at `path` carries a seal; if so, checks it. Returns
/// false for a file without one (written by Module::save or an older
/// libddp); throws UsageError naming the path when the seal does not match
/// the bytes (the file was damaged after it was written).
bool verify_seal(const std::string& path);

}  // namespace ddp::detail
