#include "checkpoint/checksum.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include <fmt/format.h>

#include <ddp/errors.h>

namespace ddp::detail {
namespace {

constexpr std::uint64_t kPrime1 = 0x9E3779B185EBCA87ULL;
constexpr std::uint64_t kPrime2 = 0xC2B2AE3D27D4EB4FULL;
constexpr std::uint64_t kPrime3 = 0x165667B19E3779F9ULL;
constexpr std::uint64_t kPrime4 = 0x85EBCA77C2B2AE63ULL;
constexpr std::uint64_t kPrime5 = 0x27D4EB2F165667C5ULL;

std::uint64_t rotate_left(std::uint64_t value, int bits) { return (value << bits) | (value >> (64 - bits)); }

// Little-endian reads, as the algorithm is specified (memcpy: no alignment needed).
std::uint64_t read64(const unsigned char* bytes) {
  std::uint64_t value;
  std::memcpy(&value, bytes, sizeof value);
  return value;
}
std::uint32_t read32(const unsigned char* bytes) {
  std::uint32_t value;
  std::memcpy(&value, bytes, sizeof value);
  return value;
}

std::uint64_t round(std::uint64_t lane, std::uint64_t input) {
  return rotate_left(lane + input * kPrime2, 31) * kPrime1;
}

std::uint64_t merge(std::uint64_t hash, std::uint64_t lane) {
  return (hash ^ round(0, lane)) * kPrime1 + kPrime4;
}

/// The trailer seal_file() appends: magic, version, the bytes sealed, their XXH64.
struct Trailer {
  char magic[8];
  std::uint64_t version;
  std::uint64_t size;
  std::uint64_t checksum;
};
static_assert(sizeof(Trailer) == 32, "the trailer is 32 bytes on disk");
constexpr char kMagic[8] = {'D', 'D', 'P', 'S', 'E', 'A', 'L', '1'};

/// XXH64 of the first `size` bytes of `file`.
std::uint64_t checksum_of(std::ifstream& file, std::uint64_t size, const std::string& path) {
  std::vector<char> buffer(std::size_t{8} << 20);
  Xxh64 hash;
  file.clear();
  file.seekg(0);
  for (std::uint64_t done = 0; done < size;) {
    const auto piece = static_cast<std::streamsize>(std::min<std::uint64_t>(buffer.size(), size - done));
    if (!file.read(buffer.data(), piece)) throw Error(fmt::format("checkpoint: reading '{}' failed", path));
    hash.update(buffer.data(), static_cast<std::size_t>(piece));
    done += static_cast<std::uint64_t>(piece);
  }
  return hash.digest();
}

}  // namespace

void Xxh64::update(const void* data, std::size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  total_ += size;
  if (pending_size_ + size < 32) {
    std::memcpy(pending_ + pending_size_, bytes, size);
    pending_size_ += size;
    return;
  }
  const auto stripe = [this](const unsigned char* input) {
    for (int lane = 0; lane < 4; ++lane) lanes_[lane] = round(lanes_[lane], read64(input + 8 * lane));
  };
  if (pending_size_ > 0) {
    const std::size_t fill = 32 - pending_size_;
    std::memcpy(pending_ + pending_size_, bytes, fill);
    stripe(pending_);
    bytes += fill;
    size -= fill;
    pending_size_ = 0;
  }
  for (; size >= 32; bytes += 32, size -= 32) stripe(bytes);
  std::memcpy(pending_, bytes, size);
  pending_size_ = size;
}

std::uint64_t Xxh64::digest() const {
  std::uint64_t hash;
  if (total_ >= 32) {
    hash = rotate_left(lanes_[0], 1) + rotate_left(lanes_[1], 7) + rotate_left(lanes_[2], 12) +
           rotate_left(lanes_[3], 18);
    for (std::uint64_t lane : lanes_) hash = merge(hash, lane);
  } else {
    hash = kPrime5;  // seed 0
  }
  hash += total_;
  const unsigned char* tail = pending_;
  std::size_t left = pending_size_;
  for (; left >= 8; tail += 8, left -= 8) hash = rotate_left(hash ^ round(0, read64(tail)), 27) * kPrime1 + kPrime4;
  if (left >= 4) {
    hash = rotate_left(hash ^ (std::uint64_t{read32(tail)} * kPrime1), 23) * kPrime2 + kPrime3;
    tail += 4;
    left -= 4;
  }
  for (; left > 0; ++tail, --left) hash = rotate_left(hash ^ (*tail * kPrime5), 11) * kPrime1;
  hash ^= hash >> 33;
  hash *= kPrime2;
  hash ^= hash >> 29;
  hash *= kPrime3;
  hash ^= hash >> 32;
  return hash;
}

void seal_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw Error(fmt::format("checkpoint: cannot open '{}' to seal it: {}", path, std::strerror(errno)));
  Trailer trailer{};
  std::memcpy(trailer.magic, kMagic, sizeof kMagic);
  trailer.version = 1;
  trailer.size = static_cast<std::uint64_t>(in.tellg());
  trailer.checksum = checksum_of(in, trailer.size, path);
  in.close();
  std::ofstream out(path, std::ios::binary | std::ios::app);
  out.write(reinterpret_cast<const char*>(&trailer), sizeof trailer);
  out.flush();
  if (!out) throw Error(fmt::format("checkpoint: appending the checksum to '{}' failed: {}", path, std::strerror(errno)));
}

bool verify_seal(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return false;  // the reader names a file it cannot open
  const auto length = static_cast<std::uint64_t>(in.tellg());
  if (length < sizeof(Trailer)) return false;
  Trailer trailer{};
  in.seekg(static_cast<std::streamoff>(length - sizeof trailer));
  in.read(reinterpret_cast<char*>(&trailer), sizeof trailer);
  if (!in || std::memcmp(trailer.magic, kMagic, sizeof kMagic) != 0) return false;
  if (trailer.size != length - sizeof trailer || trailer.checksum != checksum_of(in, trailer.size, path)) {
    throw UsageError(fmt::format("checkpoint '{}' is damaged: its bytes do not match the checksum written with them "
                                 "(changed or corrupted on disk after the save); restore it from a copy, or start "
                                 "without resuming",
                                 path));
  }
  return true;
}

}  // namespace ddp::detail
