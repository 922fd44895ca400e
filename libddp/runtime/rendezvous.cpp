#include "runtime/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <ddp/errors.h>

#include "runtime/store_client.h"
#include "runtime/store_server.h"

namespace ddp::detail {
namespace {

std::string read_string(c10d::Store& store, const std::string& key) {
  const std::vector<uint8_t> bytes = store.get(key);
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace

c10::intrusive_ptr<c10d::Store> rendezvous(const Environment& env, std::chrono::milliseconds timeout) {
  // `what`: LibTorch's reason, its first line (first_line_of), without the backtrace.
  const auto fail = [&](const std::string& what) {
    return Error(fmt::format(
        "libddp: rank {} could not meet the other ranks through the store at MASTER_ADDR:MASTER_PORT = {}:{} "
        "within {} ms: {}\nRank 0 serves this store: check that all {} ranks started with the same MASTER_ADDR "
        "and MASTER_PORT, that rank 0's host is reachable from here, and that the port is free on rank 0's host.",
        env.rank, env.master_addr, env.master_port, timeout.count(), what, env.world_size));
  };
  const bool one_node = env.world_size == env.local_world_size;
  // Only a job whose ranks all run here, meeting at a loopback address, is
  // served on loopback alone: a host name that resolves to 127.0.1.1 on rank
  // 0's node (Debian's /etc/hosts) is reached by other nodes at its real
  // address. Any other store is reachable from other hosts, so its ranks
  // must share a secret.
  const bool loopback_only = one_node && is_loopback_host(env.master_addr);
  if (!loopback_only && env.rdzv_token.empty()) {
    const std::string why = one_node ? fmt::format("MASTER_ADDR={} is not a loopback address", env.master_addr)
                                     : fmt::format("this job's {} ranks run on several nodes (LOCAL_WORLD_SIZE={})",
                                                   env.world_size, env.local_world_size);
    throw UsageError(fmt::format(
        "DDP_RDZV_TOKEN is not set, and {}: anyone who can reach {}:{} could join the job. Export the same secret "
        "for every rank before starting it, e.g. DDP_RDZV_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d "
        "' \\n'), or on one node use MASTER_ADDR=127.0.0.1 (ddprun does both for you).",
        why, env.master_addr, env.master_port));
  }
  c10::intrusive_ptr<c10d::Store> store;
  try {
    std::shared_ptr<StoreServer> server;
    if (env.rank == 0) {
      StoreServer::Options serving;
      if (loopback_only) serving.host = env.master_addr;
      serving.port = env.master_port;
      serving.run_id = env.run_id;
      serving.token = env.rdzv_token;
      // Once only: a later init() in this process finds the socket closed with the first store.
      static std::atomic<bool> listener_taken{false};
      if (!listener_taken.exchange(true)) {
        serving.listener = StoreServer::inherited_listener(std::getenv("DDP_STORE_LISTEN_FD"), env.master_port);
      }
      server = std::make_shared<StoreServer>(std::move(serving));
    }
    store = c10::make_intrusive<StoreClient>(StoreClient::Address{env.master_addr, env.master_port},
                                             StoreClient::Credentials{env.run_id, env.rdzv_token}, timeout,
                                             std::move(server));
  } catch (const UsageError& e) {
    throw UsageError(fmt::format("rank {}: {}", env.rank, e.what()));
  } catch (const std::exception& e) {
    throw fail(first_line_of(e));
  }

  const std::string world_key = "ddp/rendezvous/world_size";
  const std::string count_key = "ddp/rendezvous/joined";
  const std::string done_key = "ddp/rendezvous/complete";
  try {
    if (env.rank == 0) {
      const std::string world = std::to_string(env.world_size);
      store->set(world_key, std::vector<uint8_t>(world.begin(), world.end()));
    } else {
      store->wait({world_key}, timeout);
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
    throw fail(joined >= 0 ? fmt::format("only {} of {} ranks arrived ({})", joined, env.world_size, first_line_of(e))
                           : first_line_of(e));
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
