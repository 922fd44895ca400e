#include "launcher/orphans.h"
#include "launcher/proc_table.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace ddp::launcher {
namespace {

std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> found;
  for (const ProcessEntry& process : all_processes()) {
    if (process.parent == parent) found.push_back(process.pid);
  }
  return found;
}

}  // namespace

void become_subreaper() {
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    throw std::runtime_error(std::string("prctl(PR_SET_CHILD_SUBREAPER): ") + std::strerror(errno));
  }
}

std::vector<pid_t> children() { return children_of(::getpid()); }

int kill_orphans(const std::vector<pid_t>& spared) {
  int killed = 0;
  // A process stuck in the kernel (a device's teardown, NFS) may take long to
  // die: ddprun must not hang on it, nor stop answering signals.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  // Killing one may hand its own children to us: look again until none is left.
  while (std::chrono::steady_clock::now() < deadline) {
    std::vector<pid_t> orphans;
    for (pid_t child : children_of(::getpid())) {
      if (std::find(spared.begin(), spared.end(), child) == spared.end()) orphans.push_back(child);
    }
    if (orphans.empty()) break;
    for (pid_t orphan : orphans) {
      ::kill(orphan, SIGKILL);
      int status = 0;
      if (::waitpid(orphan, &status, WNOHANG) == orphan) ++killed;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return killed;
}

}  // namespace ddp::launcher
