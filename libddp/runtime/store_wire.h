#pragma once

// The job store's wire format, shared by its server (store_server.cpp) and
// its client (store_client.cpp). Every message is a frame: a 32-bit length,
// then that many bytes. Integers are little-endian whatever the host, so
// nodes of different kinds can meet.
//
// A connection opens with the client's hello (magic, version, the job's run
// id, its token), answered by one verdict frame; only an accepted client's
// frames are read after that. Then each request frame (an Op and its
// arguments) gets exactly one reply frame, in order, except kSet, which gets
// none: as TCPStore's set, it never waits for the server (a rank publishing
// its progress must not block on a stopped rank 0).

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::detail::store_wire {

constexpr char kMagic[8] = {'D', 'D', 'P', 'S', 'T', 'O', 'R', 'E'};
constexpr std::uint32_t kVersion = 2;  // 2: the verdicts kOtherUser and kOwnerUnknown
/// The hello's size limit: what a stranger may make the server read.
constexpr std::uint32_t kMaxHelloFrame = 4096;
/// Values are small (addresses, NCCL ids, progress reports); a larger frame is garbage.
constexpr std::uint32_t kMaxFrame = 64u << 20;

enum class Op : std::uint8_t {
  kSet = 1,  ///< No reply.
  kGet,      ///< Waits until the key exists.
  kAdd,
  kCheck,
  kWait,  ///< Waits until every key exists.
  kDelete,
  kNumKeys,
  kCompareSet,
};

enum class Verdict : std::uint8_t {
  kAccepted = 0,
  kOtherJob = 1,  ///< The server serves another run id (two jobs on one port).
  kWrongToken = 2,
  kBadHello = 3,      ///< Not a libddp store client of this version.
  kOtherUser = 4,     ///< A store without a token refuses the processes of other users,
  kOwnerUnknown = 5,  ///< and those whose owner it cannot find (socket_peer_owner).
};

struct ProtocolError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Builds one frame's payload.
class Writer {
 public:
  Writer& u8(std::uint8_t value) {
    bytes_.push_back(value);
    return *this;
  }
  Writer& u32(std::uint32_t value) { return little_endian(value, 4); }
  Writer& i64(std::int64_t value) { return little_endian(static_cast<std::uint64_t>(value), 8); }
  Writer& raw(const void* data, std::size_t size) {
    const auto* begin = static_cast<const std::uint8_t*>(data);
    bytes_.insert(bytes_.end(), begin, begin + size);
    return *this;
  }
  Writer& blob(const std::string& value) {
    return u32(static_cast<std::uint32_t>(value.size())).raw(value.data(), value.size());
  }
  Writer& blob(const std::vector<std::uint8_t>& value) {
    return u32(static_cast<std::uint32_t>(value.size())).raw(value.data(), value.size());
  }
  /// The frame: length, then payload.
  std::vector<std::uint8_t> frame() const {
    Writer framed;
    framed.u32(static_cast<std::uint32_t>(bytes_.size())).raw(bytes_.data(), bytes_.size());
    return std::move(framed.bytes_);
  }

 private:
  Writer& little_endian(std::uint64_t value, int size) {
    for (int i = 0; i < size; ++i) bytes_.push_back(static_cast<std::uint8_t>(value >> (8 * i)));
    return *this;
  }
  std::vector<std::uint8_t> bytes_;
};

/// Reads one frame's payload; a field that runs past its end is a ProtocolError.
class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t size) : data_(data), left_(size) {}
  explicit Reader(const std::vector<std::uint8_t>& payload) : Reader(payload.data(), payload.size()) {}

  std::uint8_t u8() { return static_cast<std::uint8_t>(little_endian(1)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(little_endian(4)); }
  std::int64_t i64() { return static_cast<std::int64_t>(little_endian(8)); }
  const std::uint8_t* raw(std::size_t size) {
    need(size);
    const std::uint8_t* at = data_;
    data_ += size;
    left_ -= size;
    return at;
  }
  std::string string() {
    const std::uint32_t size = u32();
    const std::uint8_t* at = raw(size);
    return std::string(reinterpret_cast<const char*>(at), size);
  }
  std::vector<std::uint8_t> bytes() {
    const std::uint32_t size = u32();
    const std::uint8_t* at = raw(size);
    return std::vector<std::uint8_t>(at, at + size);
  }
  bool done() const { return left_ == 0; }

 private:
  void need(std::size_t size) const {
    if (size > left_) throw ProtocolError("a store message ended inside a field");
  }
  std::uint64_t little_endian(int size) {
    const std::uint8_t* at = raw(static_cast<std::size_t>(size));
    std::uint64_t value = 0;
    for (int i = 0; i < size; ++i) value |= static_cast<std::uint64_t>(at[i]) << (8 * i);
    return value;
  }
  const std::uint8_t* data_;
  std::size_t left_;
};

/// A client's first frame: who it is and the secret it presents.
inline std::vector<std::uint8_t> hello_frame(const std::string& run_id, const std::string& token) {
  return Writer().raw(kMagic, sizeof kMagic).u32(kVersion).blob(run_id).blob(token).frame();
}

/// The length a frame's first four bytes announce.
inline std::uint32_t frame_length(const std::uint8_t* header) { return Reader(header, 4).u32(); }

}  // namespace ddp::detail::store_wire
