#include "launcher/group_keeper.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::launcher {
namespace {

std::runtime_error system_error(const std::string& call) {
  return std::runtime_error("ddprun: " + call + " failed: " + std::strerror(errno));
}

/// The keeper's life: collect group ids until ddprun says goodbye (0) or its
/// end of the pipe closes unannounced, which means it died: then kill them.
[[noreturn]] void keep(int fd) {
  std::vector<pid_t> groups;
  for (;;) {
    std::int32_t group = 0;
    const ssize_t n = ::read(fd, &group, sizeof group);
    if (n < 0 && errno == EINTR) continue;
    if (n == static_cast<ssize_t>(sizeof group) && group == 0) ::_exit(0);
    if (n == static_cast<ssize_t>(sizeof group)) {
      groups.push_back(static_cast<pid_t>(group));
      continue;
    }
    for (pid_t held : groups) ::kill(-held, SIGKILL);
    ::_exit(0);
  }
}

}  // namespace

GroupKeeper::GroupKeeper() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw system_error("pipe2");
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
    keep(fds[0]);
  }
  ::close(fds[0]);
  fd_ = fds[1];
}

GroupKeeper::~GroupKeeper() {
  const std::int32_t goodbye = 0;
  if (::write(fd_, &goodbye, sizeof goodbye) != static_cast<ssize_t>(sizeof goodbye)) {
    // The keeper is gone already; nothing to release.
  }
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
