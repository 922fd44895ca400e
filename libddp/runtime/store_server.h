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
  };

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
