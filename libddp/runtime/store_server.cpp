#include "runtime/store_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include <ddp/errors.h>

#include "runtime/socket_owner.h"
#include "runtime/store_wire.h"

namespace ddp::detail {
namespace {

using Clock = std::chrono::steady_clock;
using store_wire::Op;
using store_wire::Reader;
using store_wire::Verdict;
using store_wire::Writer;

/// A connection that has not said hello by then is dropped, so that idle
/// strangers cannot use up the server's descriptors.
constexpr std::chrono::seconds kHelloDeadline{10};
/// Connections that have not said hello yet, at most: past it the oldest is
/// dropped, so that strangers who keep opening connections cannot use up the
/// descriptors either (a job's own ranks say hello as soon as they connect).
constexpr std::size_t kMaxStrangers = 128;
/// Accepted per pass of the loop, so that the hellos of the connections just
/// accepted are read before a flood of newer ones could push them out.
constexpr int kAcceptsPerPass = 16;

/// A socket listening on one of `host`'s addresses of `family` at `port`,
/// or -1 with `error` set.
int try_listen(const char* host, int family, std::uint16_t port, std::string& error) {
  addrinfo hints{};
  hints.ai_family = family;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int resolved = ::getaddrinfo(host, std::to_string(port).c_str(), &hints, &found);
  if (resolved != 0) {
    error = ::gai_strerror(resolved);
    return -1;
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(found, &::freeaddrinfo);
  for (const addrinfo* address = found; address != nullptr; address = address->ai_next) {
    const int fd =
        ::socket(address->ai_family, address->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, address->ai_protocol);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    // A previous job's connections in TIME_WAIT must not block the port.
    const int on = 1;
    const int off = 0;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (address->ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    if (::bind(fd, address->ai_addr, address->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) return fd;
    error = std::strerror(errno);
    ::close(fd);
  }
  return -1;
}

/// A socket listening on `host` at `port`. Empty `host`: every interface,
/// through one dual-stack IPv6 socket, or IPv4 alone where the host (a
/// container, say) has no IPv6.
int listen_on(const std::string& host, std::uint16_t port) {
  std::string error;
  int fd = -1;
  if (host.empty()) {
    fd = try_listen(nullptr, AF_INET6, port, error);
    if (fd < 0) fd = try_listen(nullptr, AF_INET, port, error);
  } else {
    fd = try_listen(host.c_str(), AF_UNSPEC, port, error);
  }
  if (fd < 0) throw Error(fmt::format("cannot listen on {}:{}: {}", host.empty() ? "*" : host, port, error));
  return fd;
}

/// Compares in time independent of where the strings differ.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char difference = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) difference |= a[i] ^ b[i];
  return difference == 0;
}

struct Connection {
  bool accepted = false;
  bool closing = false;  ///< Close once `out` is sent (a refused hello).
  Clock::time_point opened = Clock::now();
  std::vector<std::uint8_t> in;
  std::vector<std::uint8_t> out;
  /// A get or wait whose keys are missing, answered when they arrive.
  std::optional<std::vector<std::uint8_t>> parked;
};

}  // namespace

struct StoreServer::State {
  Options options;
  int listener = -1;
  int wake[2] = {-1, -1};  ///< The destructor writes to wake[1] to stop the loop.
  std::unordered_map<int, Connection> connections;
  std::map<std::string, std::vector<std::uint8_t>> data;

  void serve() {
    for (;;) {
      std::vector<pollfd> polled{{wake[0], POLLIN, 0}, {listener, POLLIN, 0}};
      for (const auto& [fd, connection] : connections) {
        polled.push_back({fd, static_cast<short>(POLLIN | (connection.out.empty() ? 0 : POLLOUT)), 0});
      }
      if (::poll(polled.data(), polled.size(), 1000) < 0 && errno != EINTR) return;
      if (polled[0].revents != 0) return;
      if (polled[1].revents & POLLIN) accept_all();
      for (std::size_t i = 2; i < polled.size(); ++i) {
        const int fd = polled[i].fd;
        if (connections.count(fd) == 0) continue;  // a stranger accept_all dropped to make room
        if (polled[i].revents & (POLLIN | POLLHUP | POLLERR)) {
          if (!receive(fd)) {
            drop(fd);
            continue;
          }
        }
        if (!flush(fd)) drop(fd);
      }
      const Clock::time_point now = Clock::now();
      std::vector<int> silent;
      for (const auto& [fd, connection] : connections) {
        if (!connection.accepted && now - connection.opened > kHelloDeadline) silent.push_back(fd);
      }
      for (int fd : silent) drop(fd);
    }
  }

  void accept_all() {
    for (int accepted = 0; accepted < kAcceptsPerPass; ++accepted) {
      const int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        // Out of descriptors, the listener stays readable: free one a
        // stranger holds rather than poll it again at once, in a spin.
        if (errno == EMFILE || errno == ENFILE) drop_oldest_stranger();
        return;  // else EAGAIN, or a connection that went away
      }
      const int on = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
      connections[fd];
      const auto strangers = std::count_if(connections.begin(), connections.end(),
                                           [](const auto& entry) { return !entry.second.accepted; });
      if (static_cast<std::size_t>(strangers) > kMaxStrangers) drop_oldest_stranger();
    }
  }

  void drop_oldest_stranger() {
    int oldest = -1;
    for (const auto& [fd, connection] : connections) {
      if (!connection.accepted && (oldest < 0 || connection.opened < connections.at(oldest).opened)) oldest = fd;
    }
    if (oldest >= 0) drop(oldest);
  }

  void drop(int fd) {
    if (connections.erase(fd) > 0) ::close(fd);
  }

  /// Reads what arrived and handles every whole frame; false ends the connection.
  bool receive(int fd) {
    Connection& connection = connections.at(fd);
    std::uint8_t chunk[65536];
    for (;;) {
      const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
      if (n == 0) return false;
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return false;
      }
      if (connection.closing) continue;  // a refused client's further bytes are not read
      connection.in.insert(connection.in.end(), chunk, chunk + n);
      // Before the hello is whole, a stranger may not make the server hold more than one hello.
      if (!connection.accepted && connection.in.size() > 4 + store_wire::kMaxHelloFrame) return false;
    }
    std::size_t used = 0;
    while (!connection.closing && connection.in.size() - used >= 4) {
      const std::uint32_t length = store_wire::frame_length(connection.in.data() + used);
      const std::uint32_t limit = connection.accepted ? store_wire::kMaxFrame : store_wire::kMaxHelloFrame;
      if (length > limit) return false;
      if (connection.in.size() - used < 4 + length) break;
      std::vector<std::uint8_t> payload(connection.in.begin() + used + 4, connection.in.begin() + used + 4 + length);
      used += 4 + length;
      try {
        if (!connection.accepted) {
          hello(fd, connection, payload);
        } else {
          if (connection.parked) return false;  // a client has one request in flight
          if (!answer(connection, payload)) connection.parked = std::move(payload);
        }
      } catch (const std::exception&) {  // garbage, or an add to a key that holds no number
        return false;
      }
    }
    connection.in.erase(connection.in.begin(), connection.in.begin() + used);
    return true;
  }

  void hello(int fd, Connection& connection, const std::vector<std::uint8_t>& payload) {
    Reader reader(payload);
    Verdict verdict = Verdict::kBadHello;
    if (payload.size() >= sizeof store_wire::kMagic &&
        std::memcmp(reader.raw(sizeof store_wire::kMagic), store_wire::kMagic, sizeof store_wire::kMagic) == 0 &&
        reader.u32() == store_wire::kVersion) {
      const std::string run_id = reader.string();
      const std::string token = reader.string();
      verdict = run_id != options.run_id             ? Verdict::kOtherJob
                : !same_secret(token, options.token) ? Verdict::kWrongToken
                                                     : Verdict::kAccepted;
      // Without a token, the job's user is what its ranks share: another
      // user's process on this host is a stranger.
      if (verdict == Verdict::kAccepted && options.token.empty()) {
        const std::optional<uid_t> owner = socket_peer_owner(fd);
        verdict = !owner ? Verdict::kOwnerUnknown : *owner != ::geteuid() ? Verdict::kOtherUser : verdict;
      }
    }
    // The run id is the job's name, not its secret: a rank of another job is told whose store it reached.
    const auto reply = Writer().u8(static_cast<std::uint8_t>(verdict)).blob(options.run_id).frame();
    connection.out.insert(connection.out.end(), reply.begin(), reply.end());
    connection.accepted = verdict == Verdict::kAccepted;
    connection.closing = !connection.accepted;
  }

  /// Answers one request, or returns false for a get or wait that must wait for its keys.
  bool answer(Connection& connection, const std::vector<std::uint8_t>& payload) {
    Reader reader(payload);
    Writer reply;
    bool changed = false;
    bool replies = true;
    const auto op = static_cast<Op>(reader.u8());
    switch (op) {
      case Op::kSet: {
        std::string key = reader.string();
        data[std::move(key)] = reader.bytes();
        changed = true;
        replies = false;
        break;
      }
      case Op::kGet: {
        const auto found = data.find(reader.string());
        if (found == data.end()) return park(reader);
        reply.blob(found->second);
        break;
      }
      case Op::kAdd: {
        const std::string key = reader.string();
        const std::int64_t delta = reader.i64();
        std::vector<std::uint8_t>& value = data[key];
        // Decimal text, as TCPStore keeps counters: a get of the key reads the number.
        const std::int64_t sum = (value.empty() ? 0 : std::stoll(std::string(value.begin(), value.end()))) + delta;
        const std::string text = std::to_string(sum);
        value.assign(text.begin(), text.end());
        reply.i64(sum);
        changed = true;
        break;
      }
      case Op::kCheck:
      case Op::kWait: {
        bool all = true;
        for (std::uint32_t n = reader.u32(); n > 0; --n) {
          const bool present = data.count(reader.string()) > 0;  // every key read, present or not
          all = all && present;
        }
        if (op == Op::kWait && !all) return park(reader);
        if (op == Op::kCheck) reply.u8(all ? 1 : 0);
        break;
      }
      case Op::kDelete: reply.u8(data.erase(reader.string()) > 0 ? 1 : 0); break;
      case Op::kNumKeys: reply.i64(static_cast<std::int64_t>(data.size())); break;
      case Op::kCompareSet: {
        const std::string key = reader.string();
        const std::vector<std::uint8_t> expected = reader.bytes();
        std::vector<std::uint8_t> desired = reader.bytes();
        // TCPStore's rule: a missing key is set only when the caller expected it missing (empty).
        const auto found = data.find(key);
        if (found == data.end()) {
          if (expected.empty()) {
            data[key] = desired;
            changed = true;
          }
          reply.blob(expected.empty() ? desired : expected);
        } else {
          if (found->second == expected) {
            found->second = std::move(desired);
            changed = true;
          }
          reply.blob(found->second);
        }
        break;
      }
      default: throw store_wire::ProtocolError("unknown store operation");
    }
    if (!reader.done()) throw store_wire::ProtocolError("a store request with bytes left over");
    if (replies) {
      const auto framed = reply.frame();
      connection.out.insert(connection.out.end(), framed.begin(), framed.end());
    }
    if (changed) answer_parked();
    return true;
  }

  /// False (park the request until its keys arrive) for a request read to
  /// its end: a malformed one is refused now, not when another client's set
  /// answers it (which would end that client's connection instead).
  static bool park(const Reader& reader) {
    if (!reader.done()) throw store_wire::ProtocolError("a store request with bytes left over");
    return false;
  }

  void answer_parked() {
    for (auto& [fd, connection] : connections) {
      if (!connection.parked) continue;
      std::vector<std::uint8_t> payload = std::move(*connection.parked);
      connection.parked.reset();
      if (!answer(connection, payload)) connection.parked = std::move(payload);
    }
  }

  /// Sends what is queued, as far as the socket takes it; false ends the connection.
  bool flush(int fd) {
    Connection& connection = connections.at(fd);
    while (!connection.out.empty()) {
      const ssize_t n = ::send(fd, connection.out.data(), connection.out.size(), MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
      }
      connection.out.erase(connection.out.begin(), connection.out.begin() + n);
    }
    return !connection.closing;
  }
};

int StoreServer::inherited_listener(const char* fd_text, std::uint16_t port) {
  if (fd_text == nullptr || *fd_text == '\0') return -1;
  char* end = nullptr;
  const long fd = std::strtol(fd_text, &end, 10);
  if (*end != '\0' || fd < 0 || fd > 65535) return -1;
  int listening = 0;
  socklen_t size = sizeof listening;
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  const int socket = static_cast<int>(fd);
  if (::getsockopt(socket, SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) != 0 || listening == 0 ||
      ::getsockname(socket, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return -1;
  }
  std::uint16_t bound = 0;
  if (address.ss_family == AF_INET) bound = ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
  if (address.ss_family == AF_INET6) bound = ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
  return bound == port ? socket : -1;
}

StoreServer::StoreServer(Options options) : state_(std::make_unique<State>()) {
  state_->options = std::move(options);
  if (state_->options.listener >= 0) {
    // Taken over: this process's own from now on, non-blocking as the loop needs it, and not for its children.
    state_->listener = state_->options.listener;
    const int flags = ::fcntl(state_->listener, F_GETFL);
    if (flags < 0 || ::fcntl(state_->listener, F_SETFL, flags | O_NONBLOCK) != 0 ||
        ::fcntl(state_->listener, F_SETFD, FD_CLOEXEC) != 0) {
      ::close(state_->listener);
      throw Error(fmt::format("cannot take over the store's socket: {}", std::strerror(errno)));
    }
  } else {
    state_->listener = listen_on(state_->options.host, state_->options.port);
  }
  if (::pipe2(state_->wake, O_CLOEXEC) != 0) {
    ::close(state_->listener);
    throw Error(fmt::format("pipe2 failed: {}", std::strerror(errno)));
  }
  thread_ = std::thread([state = state_.get()] { state->serve(); });
}

StoreServer::~StoreServer() {
  const char stop = 1;
  if (::write(state_->wake[1], &stop, 1) != 1) {
    // The loop also ends when poll fails; nothing else can stop it.
  }
  thread_.join();
  for (const auto& [fd, connection] : state_->connections) ::close(fd);
  for (int fd : {state_->listener, state_->wake[0], state_->wake[1]}) ::close(fd);
}

}  // namespace ddp::detail
