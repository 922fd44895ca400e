#include "runtime/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <ddp/errors.h>

#include "compat/torch_compat.h"

namespace ddp::detail {
namespace {

std::string read_string(c10d::Store& store, const std::string& key) {
  const std::vector<uint8_t> bytes = store.get(key);
  return std::string(bytes.begin(), bytes.end());
}

/// A socket listening on `host`:`port`, for the store's server to take.
int listen_on(const std::string& host, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int resolved = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (resolved != 0) throw Error(fmt::format("cannot resolve {}: {}", host, ::gai_strerror(resolved)));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(found, &::freeaddrinfo);
  const int fd = ::socket(found->ai_family, found->ai_socktype | SOCK_CLOEXEC, found->ai_protocol);
  if (fd < 0) throw Error(fmt::format("socket() failed: {}", std::strerror(errno)));
  // As the TCPStore's own server: a previous job's connections in TIME_WAIT must not block the port.
  const int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  if (::bind(fd, found->ai_addr, found->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    const int error = errno;
    ::close(fd);
    throw Error(fmt::format("cannot listen on {}:{}: {}", host, port, std::strerror(error)));
  }
  return fd;
}

}  // namespace

c10::intrusive_ptr<c10d::Store> rendezvous(const Environment& env, std::chrono::milliseconds timeout) {
  const auto fail = [&](std::string what) {
    what = what.substr(0, what.find('\n'));  // LibTorch's reason, without its backtrace
    return Error(fmt::format(
        "libddp: rank {} could not meet the other ranks through the store at MASTER_ADDR:MASTER_PORT = {}:{} "
        "within {} ms: {}\nRank 0 serves this store: check that all {} ranks started with the same MASTER_ADDR "
        "and MASTER_PORT, that rank 0's host is reachable from here, and that the port is free on rank 0's host.",
        env.rank, env.master_addr, env.master_port, timeout.count(), what, env.world_size));
  };
  c10d::TCPStoreOptions options;
  options.port = env.master_port;
  options.isServer = env.rank == 0;
  options.numWorkers = static_cast<std::size_t>(env.world_size);
  options.waitWorkers = false;
  options.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
#if DDP_STORE_TAKES_LISTENING_SOCKET
    // The store's own server would listen on every interface. Only a job
    // whose ranks all run here: a host name that resolves to 127.0.1.1 on
    // rank 0's node (Debian's /etc/hosts) is reached by other nodes at its
    // real address.
    if (options.isServer && env.world_size == env.local_world_size && is_loopback_host(env.master_addr)) {
      options.masterListenFd = listen_on(env.master_addr, env.master_port);
    }
#endif
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
  } catch (const std::exception& e) {
    throw fail(e.what());
  }

  const std::string world_key = "ddp/rendezvous/world_size";
  const std::string run_key = "ddp/rendezvous/run_id";
  const std::string count_key = "ddp/rendezvous/joined";
  const std::string done_key = "ddp/rendezvous/complete";
  try {
    if (env.rank == 0) {
      // The job's identity first: a rank that sees the world size sees it too.
      store->set(run_key, std::vector<uint8_t>(env.run_id.begin(), env.run_id.end()));
      const std::string world = std::to_string(env.world_size);
      store->set(world_key, std::vector<uint8_t>(world.begin(), world.end()));
    } else {
      store->wait({world_key}, timeout);
      // Before this rank counts itself in: a rank of another job that reached
      // this store (two jobs on one MASTER_PORT) must not join it.
      const std::string run = read_string(*store, run_key);
      if (run != env.run_id) {
        const auto shown = [](const std::string& id) { return id.empty() ? std::string("<unset>") : "'" + id + "'"; };
        throw UsageError(fmt::format(
            "rank {} of job {} reached the rendezvous store at {}:{}, which serves job {}: two jobs use the same "
            "MASTER_PORT. Give each job its own port (ddprun --standalone picks a free one) and start every rank "
            "of a job with the same TORCHELASTIC_RUN_ID (ddprun sets it; --rdzv-id chooses it).",
            env.rank, shown(env.run_id), env.master_addr, env.master_port, shown(run)));
      }
      const std::string world = read_string(*store, world_key);
      if (world != std::to_string(env.world_size)) {
        throw UsageError(
            fmt::format("WORLD_SIZE differs between ranks: rank 0 has {}, rank {} has {}. Start every "
                        "rank with the same WORLD_SIZE.",
                        world, env.rank, env.world_size));
      }
    }
    if (store->add(count_key, 1) == env.world_size) store->set(done_key, std::vector<uint8_t>{1});
    store->wait({done_key}, timeout);
  } catch (const UsageError&) {
    throw;
  } catch (const std::exception& e) {
    std::int64_t joined = -1;
    try {
      joined = store->add(count_key, 0);
    } catch (...) {
    }
    throw fail(joined >= 0 ? fmt::format("only {} of {} ranks arrived ({})", joined, env.world_size, e.what())
                           : std::string(e.what()));
  }
  return store;
}

bool is_loopback_host(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(found, &::freeaddrinfo);
  for (const addrinfo* address = found; address != nullptr; address = address->ai_next) {
    if (address->ai_family == AF_INET) {
      const auto* ipv4 = reinterpret_cast<const sockaddr_in*>(address->ai_addr);
      if ((ntohl(ipv4->sin_addr.s_addr) >> 24) != 127) return false;
    } else if (address->ai_family == AF_INET6) {
      const auto* ipv6 = reinterpret_cast<const sockaddr_in6*>(address->ai_addr);
      if (!IN6_IS_ADDR_LOOPBACK(&ipv6->sin6_addr)) return false;
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace ddp::detail
