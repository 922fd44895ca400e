#include "launcher/ports.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "launcher/launch_options.h"

namespace ddp::launcher {

int free_port() { return ReservedPort::on_loopback().port(); }

ReservedPort ReservedPort::on_loopback() {
  ReservedPort reserved;
  reserved.fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  // SO_REUSEADDR as the store sets it on the sockets it binds itself.
  const int reuse = 1;
  if (reserved.fd_ < 0 || ::setsockopt(reserved.fd_, SOL_SOCKET, SO_REUSEADDR, &reuse, sizeof(reuse)) != 0 ||
      ::bind(reserved.fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(reserved.fd_, SOMAXCONN) != 0 ||
      ::getsockname(reserved.fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    throw std::runtime_error(fmt::format("ddprun: cannot reserve a loopback port: {}", std::strerror(errno)));
  }
  reserved.port_ = ntohs(address.sin_port);
  return reserved;
}

ReservedPort& ReservedPort::operator=(ReservedPort&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.fd_;
    port_ = other.port_;
    other.fd_ = -1;
  }
  return *this;
}

void ReservedPort::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void require_port_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(static_cast<uint16_t>(port));
  // SO_REUSEADDR as the TCPStore sets it: connections of a previous job that
  // linger in TIME_WAIT do not keep the store from listening, only a listener does.
  const int reuse = 1;
  const bool bound = fd >= 0 && ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &reuse, sizeof(reuse)) == 0 &&
                     ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  const int error = errno;
  if (fd >= 0) ::close(fd);
  if (!bound) {
    throw LaunchUsageError(fmt::format("--master-port {} cannot be used on this host ({}); pick another port or "
                                       "use --standalone to get a free one",
                                       port, std::strerror(error)));
  }
}

}  // namespace ddp::launcher
