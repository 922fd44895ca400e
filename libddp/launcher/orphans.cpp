#include "launcher/orphans.h"

#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
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

std::vector<pid_t> children_of(pid_t parent, pid_t spared) {
  std::vector<pid_t> children;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return children;
  while (const dirent* entry = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == spared) continue;
    if (parent_of(static_cast<pid_t>(pid)) == parent) children.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(proc);
  return children;
}

}  // namespace

void become_subreaper() {
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    throw std::runtime_error(std::string("prctl(PR_SET_CHILD_SUBREAPER): ") + std::strerror(errno));
  }
}

int kill_orphans(pid_t spared) {
  int killed = 0;
  // Killing one may hand its own children to us: look again until none is left.
  for (int round = 0; round < 100; ++round) {
    const std::vector<pid_t> orphans = children_of(::getpid(), spared);
    if (orphans.empty()) break;
    for (pid_t orphan : orphans) {
      ::kill(orphan, SIGKILL);
      int status = 0;
      while (::waitpid(orphan, &status, 0) < 0 && errno == EINTR) {
      }
      ++killed;
    }
  }
  return killed;
}

}  // namespace ddp::launcher
