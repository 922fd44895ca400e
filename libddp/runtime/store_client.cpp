#include "runtime/store_client.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include <ddp/errors.h>

#include "comm/store_server_gone.h"
#include "runtime/store_server.h"
#include "runtime/store_wire.h"

namespace ddp::detail {
namespace {

using Clock = std::chrono::steady_clock;
using store_wire::Op;
using store_wire::Reader;
using store_wire::Verdict;
using store_wire::Writer;

/// c10d's convention: a zero timeout waits forever.
Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  return timeout.count() == 0 ? Clock::time_point::max() : Clock::now() + timeout;
}

/// Milliseconds left for poll(): -1 without a deadline, 0 once it passed.
int poll_budget(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return -1;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

struct Timeout : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Waits for `events` on `fd` until the deadline; a Timeout when it passes.
void await(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd polled{fd, events, 0};
    const int ready = ::poll(&polled, 1, poll_budget(deadline));
    if (ready > 0) return;
    if (ready == 0) throw Timeout("timed out");
    if (errno != EINTR) throw std::runtime_error(fmt::format("poll failed: {}", std::strerror(errno)));
  }
}

/// The server closed or reset the connection.
struct ConnectionLost : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Throws ConnectionLost where `error` (an errno) says the peer went away, else a runtime_error.
[[noreturn]] void connection_failed(int error) {
  const std::string message = fmt::format("the connection failed: {}", std::strerror(error));
  if (error == ECONNRESET || error == EPIPE) throw ConnectionLost(message);
  throw std::runtime_error(message);
}

void send_all(int fd, const std::vector<std::uint8_t>& bytes, Clock::time_point deadline) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      sent += static_cast<std::size_t>(n);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      await(fd, POLLOUT, deadline);
    } else if (errno != EINTR) {
      connection_failed(errno);
    }
  }
}

void receive_exactly(int fd, std::uint8_t* into, std::size_t size, Clock::time_point deadline) {
  std::size_t received = 0;
  while (received < size) {
    const ssize_t n = ::recv(fd, into + received, size - received, MSG_DONTWAIT);
    if (n > 0) {
      received += static_cast<std::size_t>(n);
    } else if (n == 0) {
      throw ConnectionLost("the store closed the connection");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      await(fd, POLLIN, deadline);
    } else if (errno != EINTR) {
      connection_failed(errno);
    }
  }
}

std::vector<std::uint8_t> receive_frame(int fd, Clock::time_point deadline) {
  std::uint8_t header[4];
  receive_exactly(fd, header, sizeof header, deadline);
  const std::uint32_t length = store_wire::frame_length(header);
  if (length > store_wire::kMaxFrame) throw std::runtime_error("the store sent a malformed reply");
  std::vector<std::uint8_t> payload(length);
  receive_exactly(fd, payload.data(), length, deadline);
  return payload;
}

/// A connected socket to one of `host`'s addresses, or -1 with `error` set
/// and `refused` telling whether the last address refused the connection.
int try_connect(const std::string& host, std::uint16_t port, Clock::time_point deadline, std::string& error,
                bool& refused) {
  refused = false;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int resolved = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (resolved != 0) {
    error = fmt::format("cannot resolve {}: {}", host, ::gai_strerror(resolved));
    return -1;
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(found, &::freeaddrinfo);
  for (const addrinfo* address = found; address != nullptr; address = address->ai_next) {
    const int fd =
        ::socket(address->ai_family, address->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, address->ai_protocol);
    if (fd < 0) {
      error = fmt::format("socket() failed: {}", std::strerror(errno));
      continue;
    }
    // Non-blocking, so that an unreachable host costs the deadline, not the kernel's two minutes.
    int result = ::connect(fd, address->ai_addr, address->ai_addrlen);
    if (result != 0 && errno == EINPROGRESS) {
      try {
        await(fd, POLLOUT, std::min(deadline, Clock::now() + std::chrono::seconds(5)));
        socklen_t length = sizeof result;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &result, &length);
        errno = result;
      } catch (const Timeout&) {
        result = -1;
        errno = ETIMEDOUT;
      }
    }
    if (result == 0) {
      const int on = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
      return fd;
    }
    error = std::strerror(errno);
    refused = errno == ECONNREFUSED;
    ::close(fd);
  }
  return -1;
}

}  // namespace

StoreClient::StoreClient(Address address, Credentials credentials, std::chrono::milliseconds timeout,
                         std::shared_ptr<StoreServer> server)
    : c10d::Store(timeout),
      address_(std::move(address)),
      credentials_(std::move(credentials)),
      server_(std::move(server)) {
  connect(timeout);
}

StoreClient::~StoreClient() { disconnect(); }

void StoreClient::disconnect() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void StoreClient::connect(std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = deadline_after(timeout);
  std::string error = "nothing listens there";
  bool refused = false;
  auto pause = std::chrono::milliseconds(10);
  // Rank 0 may not listen yet: keep trying until the deadline.
  while ((fd_ = try_connect(address_.host, address_.port, deadline, error, refused)) < 0) {
    if (Clock::now() + pause >= deadline) {
      const std::string message =
          fmt::format("cannot reach the store at {}:{}: {}", address_.host, address_.port, error);
      if (refused) throw StoreServerGone(message);
      throw Error(message);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(1000));
  }
  std::vector<std::uint8_t> verdict_payload;
  try {
    send_all(fd_, store_wire::hello_frame(credentials_.run_id, credentials_.token), deadline);
    verdict_payload = receive_frame(fd_, deadline);
  } catch (const std::exception& e) {
    disconnect();
    const std::string message =
        fmt::format("the store at {}:{} did not answer this rank's hello: {}", address_.host, address_.port, e.what());
    if (dynamic_cast<const ConnectionLost*>(&e) != nullptr) throw StoreServerGone(message);
    throw Error(message);
  }
  Reader reader(verdict_payload);
  const auto verdict = static_cast<Verdict>(reader.u8());
  const std::string served = reader.string();
  if (verdict == Verdict::kAccepted) return;
  disconnect();
  const auto shown = [](const std::string& id) { return id.empty() ? std::string("<unset>") : "'" + id + "'"; };
  if (verdict == Verdict::kOtherJob) {
    throw UsageError(fmt::format(
        "the rendezvous store at {}:{} serves job {}, not this rank's job {}: two jobs use the same "
        "MASTER_PORT. Give each job its own port (ddprun --standalone picks a free one) and start every rank "
        "of a job with the same TORCHELASTIC_RUN_ID (ddprun sets it; --rdzv-id chooses it).",
        address_.host, address_.port, shown(served), shown(credentials_.run_id)));
  }
  if (verdict == Verdict::kBadHello) {
    throw UsageError(
        fmt::format("the store at {}:{} speaks another version of libddp's store protocol: start "
                    "every rank with the same libddp build",
                    address_.host, address_.port));
  }
  if (verdict == Verdict::kOtherUser) {
    throw UsageError(fmt::format(
        "the rendezvous store at {}:{} (job {}) refused this process: served without DDP_RDZV_TOKEN, it lets in "
        "only the processes of the user who started rank 0. Start every rank as that user, or export the same "
        "DDP_RDZV_TOKEN for every rank.",
        address_.host, address_.port, shown(served)));
  }
  if (verdict == Verdict::kOwnerUnknown) {
    throw UsageError(fmt::format(
        "the rendezvous store at {}:{} (job {}), served without DDP_RDZV_TOKEN, cannot tell which user owns this "
        "rank's connection (the kernel's socket table, /proc/net/tcp or tcp6, is unreadable there): export the "
        "same DDP_RDZV_TOKEN for every rank (ddprun does).",
        address_.host, address_.port, shown(served)));
  }
  throw UsageError(fmt::format(
      "the rendezvous store at {}:{} (job {}) refused this rank's DDP_RDZV_TOKEN: every rank of a job must "
      "present the same token. ddprun makes one for a job on one node; for a job across nodes export the same "
      "DDP_RDZV_TOKEN on every node before starting ddprun.",
      address_.host, address_.port, shown(served)));
}

std::vector<std::uint8_t> StoreClient::request(const std::vector<std::uint8_t>& frame,
                                               std::chrono::milliseconds timeout, const std::string& what,
                                               bool replied) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0) connect(timeout);
  const Clock::time_point deadline = deadline_after(timeout);
  try {
    send_all(fd_, frame, deadline);
    return replied ? receive_frame(fd_, deadline) : std::vector<std::uint8_t>();
  } catch (const Timeout&) {
    disconnect();
    throw Error(fmt::format("the store at {}:{} gave no answer to {} within {} ms", address_.host, address_.port, what,
                            timeout.count()));
  } catch (const std::exception& e) {
    disconnect();
    const std::string message =
        fmt::format("the store at {}:{} failed during {}: {}", address_.host, address_.port, what, e.what());
    if (dynamic_cast<const ConnectionLost*>(&e) != nullptr) throw StoreServerGone(message);
    throw Error(message);
  }
}

void StoreClient::set(const std::string& key, const std::vector<std::uint8_t>& value) {
  request(Writer().u8(static_cast<std::uint8_t>(Op::kSet)).blob(key).blob(value).frame(), timeout_,
          fmt::format("set('{}')", key), /*replied=*/false);
}

std::vector<std::uint8_t> StoreClient::compareSet(const std::string& key, const std::vector<std::uint8_t>& expected,
                                                  const std::vector<std::uint8_t>& desired) {
  const auto reply =
      request(Writer().u8(static_cast<std::uint8_t>(Op::kCompareSet)).blob(key).blob(expected).blob(desired).frame(),
              timeout_, fmt::format("compareSet('{}')", key));
  return Reader(reply).bytes();
}

std::vector<std::uint8_t> StoreClient::get(const std::string& key) {
  const auto reply = request(Writer().u8(static_cast<std::uint8_t>(Op::kGet)).blob(key).frame(), timeout_,
                             fmt::format("get('{}')", key));
  return Reader(reply).bytes();
}

std::int64_t StoreClient::add(const std::string& key, std::int64_t value) {
  const auto reply = request(Writer().u8(static_cast<std::uint8_t>(Op::kAdd)).blob(key).i64(value).frame(), timeout_,
                             fmt::format("add('{}')", key));
  return Reader(reply).i64();
}

bool StoreClient::deleteKey(const std::string& key) {
  const auto reply = request(Writer().u8(static_cast<std::uint8_t>(Op::kDelete)).blob(key).frame(), timeout_,
                             fmt::format("deleteKey('{}')", key));
  return Reader(reply).u8() != 0;
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  Writer writer;
  writer.u8(static_cast<std::uint8_t>(Op::kCheck)).u32(static_cast<std::uint32_t>(keys.size()));
  for (const std::string& key : keys) writer.blob(key);
  return Reader(request(writer.frame(), timeout_, "check")).u8() != 0;
}

std::int64_t StoreClient::getNumKeys() {
  return Reader(request(Writer().u8(static_cast<std::uint8_t>(Op::kNumKeys)).frame(), timeout_, "getNumKeys")).i64();
}

void StoreClient::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void StoreClient::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  Writer writer;
  writer.u8(static_cast<std::uint8_t>(Op::kWait)).u32(static_cast<std::uint32_t>(keys.size()));
  for (const std::string& key : keys) writer.blob(key);
  request(writer.frame(), timeout,
          fmt::format("wait for {} key(s), the first '{}'", keys.size(), keys.empty() ? std::string() : keys.front()));
}

c10::intrusive_ptr<c10d::Store> StoreClient::clone() {
  return c10::make_intrusive<StoreClient>(address_, credentials_, timeout_, server_);
}

}  // namespace ddp::detail
