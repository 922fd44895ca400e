#pragma once

#include <sys/types.h>

#include <optional>

namespace ddp::detail {

/// The user who owns the other end of `fd`, a TCP connection accepted from
/// a socket of this host (over loopback), as the kernel's socket tables
/// (/proc/net/tcp, tcp6) list it; nullopt when they do not list it (the
/// peer is on another host, or closed its socket already).
///
/// TCP has no SO_PEERCRED: this is how a store served without a token tells
/// the job's own user's processes from another user's.
std::optional<uid_t> socket_peer_owner(int fd);

}  // namespace ddp::detail
