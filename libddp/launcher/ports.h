#pragma once

namespace ddp::launcher {

/// A TCP port that is free on this host now, picked by the kernel.
int free_port();

/// Throws LaunchUsageError unless `port` can be bound on this host, so that a
/// job whose rendezvous port is taken fails before anything starts.
void require_port_free(int port);

}  // namespace ddp::launcher
