#include "runtime/socket_owner.h"

#include <netinet/in.h>
#include <sys/socket.h>

#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>

namespace ddp::detail {
namespace {

/// `address` as the kernel's socket tables write it: each 32-bit word of
/// the address in hexadecimal as this host reads it, then the port.
std::string table_form(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(address);
    return fmt::format("{:08X}:{:04X}", v4.sin_addr.s_addr, ntohs(v4.sin_port));
  }
  const auto& v6 = reinterpret_cast<const sockaddr_in6&>(address);
  std::string text;
  for (int word = 0; word < 4; ++word) {
    std::uint32_t value = 0;
    for (int byte = 0; byte < 4; ++byte) {
      reinterpret_cast<std::uint8_t*>(&value)[byte] = v6.sin6_addr.s6_addr[4 * word + byte];
    }
    text += fmt::format("{:08X}", value);
  }
  return text + fmt::format(":{:04X}", ntohs(v6.sin6_port));
}

}  // namespace

std::optional<uid_t> socket_peer_owner(int fd) {
  sockaddr_storage here{};
  sockaddr_storage peer{};
  socklen_t here_size = sizeof here;
  socklen_t peer_size = sizeof peer;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&here), &here_size) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_size) != 0 || here.ss_family != peer.ss_family ||
      (here.ss_family != AF_INET && here.ss_family != AF_INET6)) {
    return std::nullopt;
  }
  // The peer's own socket is the row whose local end is the peer and whose
  // remote end is this socket.
  const std::string peer_end = table_form(peer);
  const std::string this_end = table_form(here);
  std::ifstream table(here.ss_family == AF_INET ? "/proc/net/tcp" : "/proc/net/tcp6");
  std::string line;
  std::getline(table, line);  // the column names
  while (std::getline(table, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state, queues, timer, retransmits;
    uid_t uid = 0;
    if (!(fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid)) continue;
    if (local == peer_end && remote == this_end) return uid;
  }
  return std::nullopt;
}

}  // namespace ddp::detail
