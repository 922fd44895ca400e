#pragma once

#include <sys/types.h>

namespace ddp::launcher {

/// Makes ddprun the reaper of its orphaned descendants: a worker's
/// descendant that left the worker's process group (setsid, a daemon) is
/// handed to ddprun when its parent dies, instead of to init, so that
/// kill_orphans() can find it. (Should ddprun itself be SIGKILLed, such a
/// process outlives the job: the group keeper kills groups only.)
void become_subreaper();

/// Kills and reaps every child of this process except `spared` (the group
/// keeper): once the workers are reaped, those are descendants they left
/// behind. Returns how many there were.
int kill_orphans(pid_t spared);

}  // namespace ddp::launcher
