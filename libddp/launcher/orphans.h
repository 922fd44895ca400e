#pragma once

#include <sys/types.h>

#include <vector>

namespace ddp::launcher {

/// Makes ddprun the reaper of its orphaned descendants: a worker's
/// descendant that left the worker's process group (setsid, a daemon) is
/// handed to ddprun when its parent dies, instead of to init, so that
/// kill_orphans() can find it. (Should ddprun itself be SIGKILLed, the
/// group keeper kills such processes.)
void become_subreaper();

/// The children this process has now (those of a shell that exec'd ddprun
/// included), to be spared by kill_orphans().
std::vector<pid_t> children();

/// Kills and reaps every child of this process but `spared` (the group
/// keeper, the children ddprun started with): once the workers are reaped,
/// those are descendants they left behind. Waits at most a few seconds for
/// them to die. Returns how many there were.
int kill_orphans(const std::vector<pid_t>& spared);

}  // namespace ddp::launcher
