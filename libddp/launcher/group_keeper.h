#pragma once

#include <sys/types.h>

namespace ddp::launcher {

/// A small process ddprun starts before any worker, which kills every
/// worker's process group if ddprun ends without releasing it (SIGKILL, a
/// crash): the kernel then closes ddprun's end of their pipe. The workers'
/// own parent-death signal reaches only each group's leader, so without it
/// a worker that is a wrapper script (no exec) leaves its children running.
/// It also kills the descendants of ddprun it saw (it looks every 0.5 s)
/// outside those groups: a worker's child that called setsid.
class GroupKeeper {
 public:
  GroupKeeper();
  /// Without release() (an exception left ddprun's supervision) the keeper
  /// kills as if ddprun had died, so that no worker outlives ddprun.
  ~GroupKeeper();
  GroupKeeper(const GroupKeeper&) = delete;
  GroupKeeper& operator=(const GroupKeeper&) = delete;

  /// From now on the keeper kills `group` if ddprun goes away.
  void hold(pid_t group);
  /// The keeper's process (a child of ddprun).
  pid_t pid() const { return pid_; }
  /// The job ended under supervision (every worker reaped): the keeper
  /// exits without killing anything.
  void release();

 private:
  pid_t pid_ = -1;
  int fd_ = -1;  ///< ddprun's end of the pipe.
};

}  // namespace ddp::launcher
