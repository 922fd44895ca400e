#include "launcher/orphans.h"

#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace ddp::launcher {
namespace {

/// The parent of process `pid`, from /proc/PID/stat; -1 if it is gone.
pid_t parent_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return -1;
  // "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses, the last ')' ends it.
  const auto end = stat.rfind(')');
  if (end == std::string::npos || end + 4 >= stat.size()) return -1;
  return static_cast<pid_t>(std::strtol(stat.c_str() + end + 4, nullptr, 10));
}

std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> found;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return found;
  while (const dirent* entry = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    if (parent_of(static_cast<pid_t>(pid)) == parent) found.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(proc);
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
