#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

namespace ddp::detail {

/// The job's key-value store, served by rank 0 on one thread. A connection
/// is read only after its first frame presented the job's run id and token
/// (store_wire.h): a stranger that reaches the port learns nothing and can
/// make the server read at most one small hello before it is dropped.
///
/// LibTorch's TCPStore cannot do this (it reads every client's requests and,
/// in 2.x, lists its keys to any of them), and 1.13's binds every interface.
class StoreServer {
 public:
  struct Options {
    /// The address to listen on; empty means every interface.
    std::string host;
    std::uint16_t port = 0;
    std::string run_id;
    /// What every client must present. Empty: the store is on loopback, and
    /// only processes of this process's user are let in (socket_peer_owner).
    std::string token;
    /// A socket already listening at `port` to serve on, taken over (see
    /// inherited_listener); -1: listen on `host` and `port` here.
    int listener = -1;
  };

  /// The socket named by `fd_text` (DDP_STORE_LISTEN_FD, which ddprun
  /// --standalone gives rank 0: the port it reserved, held listening since
  /// its pick so that no other process could take it) if it is one listening
  /// at `port`; else -1, and the store listens itself (a variable inherited
  /// by a process that was not given the socket).
  static int inherited_listener(const char* fd_text, std::uint16_t port);

  /// Listens at once (a busy port is an Error naming it) and serves until destroyed.
  explicit StoreServer(Options options);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
  std::thread thread_;
};

}  // namespace ddp::detail
