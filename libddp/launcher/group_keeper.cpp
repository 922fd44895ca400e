#include "launcher/group_keeper.h"
#include "launcher/proc_table.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::launcher {
namespace {

std::runtime_error system_error(const std::string& call) {
  return std::runtime_error("ddprun: " + call + " failed: " + std::strerror(errno));
}

/// Adds every living descendant of `root` to `known` (pid -> start time).
void record_descendants(pid_t root, std::map<pid_t, unsigned long long>& known) {
  std::multimap<pid_t, ProcessEntry> children;
  for (const ProcessEntry& process : all_processes()) children.emplace(process.parent, process);
  std::vector<pid_t> frontier{root};
  while (!frontier.empty()) {
    const pid_t parent = frontier.back();
    frontier.pop_back();
    const auto [begin, end] = children.equal_range(parent);
    for (auto it = begin; it != end; ++it) {
      known[it->second.pid] = it->second.start;
      frontier.push_back(it->second.pid);
    }
  }
}

/// The keeper's life: collect group ids until ddprun says goodbye (0) or its
/// end of the pipe closes unannounced, which means it died: then kill them.
/// Every half second it also notes ddprun's descendants, because one that
/// left its worker's group (setsid) is in none of them, and once ddprun is
/// dead it belongs to init and nothing else can find it.
[[noreturn]] void keep(int fd, pid_t ddprun) {
  std::vector<pid_t> groups;
  std::map<pid_t, unsigned long long> descendants;
  for (;;) {
    pollfd polled{fd, POLLIN, 0};
    if (::poll(&polled, 1, 500) == 0) {
      record_descendants(ddprun, descendants);
      continue;
    }
    std::int32_t group = 0;
    const ssize_t n = ::read(fd, &group, sizeof group);
    if (n < 0 && errno == EINTR) continue;
    if (n == static_cast<ssize_t>(sizeof group) && group == 0) ::_exit(0);
    if (n == static_cast<ssize_t>(sizeof group)) {
      groups.push_back(static_cast<pid_t>(group));
      continue;
    }
    for (pid_t held : groups) ::kill(-held, SIGKILL);
    for (const auto& [pid, start] : descendants) {
      const auto process = read_process(pid);
      if (pid != ::getpid() && process && process->start == start) ::kill(pid, SIGKILL);
    }
    ::_exit(0);
  }
}

}  // namespace

GroupKeeper::GroupKeeper() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw system_error("pipe2");
  const pid_t ddprun = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) throw system_error("fork");
  if (pid_ == 0) {
    ::close(fds[1]);
    // Hold none of ddprun's streams open (whoever reads its output waits for their end).
    const int null = ::open("/dev/null", O_RDWR);
    if (null >= 0) {
      for (int stream : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) ::dup2(null, stream);
      if (null > STDERR_FILENO) ::close(null);
    }
    // Signals meant for the job (Ctrl-C reaches the whole foreground group)
    // are ddprun's to handle; the keeper acts only when ddprun is gone.
    for (int signal : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) ::signal(signal, SIG_IGN);
    keep(fds[0], ddprun);
  }
  ::close(fds[0]);
  fd_ = fds[1];
}

void GroupKeeper::release() {
  const std::int32_t goodbye = 0;
  if (::write(fd_, &goodbye, sizeof goodbye) != static_cast<ssize_t>(sizeof goodbye)) {
    // The keeper is gone already; nothing to release.
  }
}

GroupKeeper::~GroupKeeper() {
  // Unreleased, the close is what ddprun's death would do: the keeper kills.
  ::close(fd_);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

void GroupKeeper::hold(pid_t group) {
  const auto id = static_cast<std::int32_t>(group);
  if (::write(fd_, &id, sizeof id) != static_cast<ssize_t>(sizeof id)) throw system_error("write to the group keeper");
}

}  // namespace ddp::launcher
