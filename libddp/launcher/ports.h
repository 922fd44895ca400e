#pragma once

namespace ddp::launcher {

/// A loopback port that is free on this host now, picked by the kernel. Another
/// process may take it before it is used: a job's rendezvous reserves its port.
int free_port();

/// A loopback port picked by the kernel and held listening until close(): ddprun
/// --standalone hands the socket to rank 0's store (DDP_STORE_LISTEN_FD), so
/// that no other process can take the port between the pick and the store.
class ReservedPort {
 public:
  ReservedPort() = default;
  /// Throws std::runtime_error when no port can be reserved.
  static ReservedPort on_loopback();
  ~ReservedPort() { close(); }
  ReservedPort(ReservedPort&& other) noexcept : fd_(other.fd_), port_(other.port_) { other.fd_ = -1; }
  ReservedPort& operator=(ReservedPort&& other) noexcept;
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;

  /// The listening socket (close-on-exec), or -1.
  int fd() const { return fd_; }
  int port() const { return port_; }
  void close();

 private:
  int fd_ = -1;
  int port_ = 0;
};

/// Throws LaunchUsageError unless `port` can be bound on this host, so that a
/// job whose rendezvous port is taken fails before anything starts.
void require_port_free(int port);

}  // namespace ddp::launcher
