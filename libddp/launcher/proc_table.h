#pragma once

#include <sys/types.h>

#include <optional>
#include <vector>

namespace ddp::launcher {

/// One process as /proc/PID/stat shows it.
struct ProcessEntry {
  pid_t pid = 0;
  pid_t parent = 0;
  /// Clock ticks after boot: tells a process from a later one that reuses its pid.
  unsigned long long start = 0;
};

/// Process `pid`, or nullopt once it is gone.
std::optional<ProcessEntry> read_process(pid_t pid);

/// Every process of this host (one that ends while the list is read is left out).
std::vector<ProcessEntry> all_processes();

}  // namespace ddp::launcher
