#include "launcher/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace ddp::launcher {
namespace {

using Clock = std::chrono::steady_clock;

struct Worker {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;  // as waitpid reports it
  Clock::time_point started;
  Clock::time_point ended;
  int out_fd = -1;  // read ends of the worker's stdout and stderr
  int err_fd = -1;
  std::string out_partial;  // a line not yet ended by '\n'
  std::string err_partial;
  std::string first_error_line;
  std::string last_error_line;
};

bool looks_like_error(const std::string& line) {
  std::string lower = line;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower.find("error") != std::string::npos || lower.find("exception") != std::string::npos ||
         lower.find("terminate") != std::string::npos || lower.find("what():") != std::string::npos;
}

std::vector<std::string> worker_environment(const LaunchOptions& options, int rank) {
  std::vector<std::string> env;
  static const char* const kOwned[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                       "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"};
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string item = *entry;
    const std::string name = item.substr(0, item.find('='));
    if (std::find(std::begin(kOwned), std::end(kOwned), name) == std::end(kOwned)) env.push_back(item);
  }
  const int world = options.nproc_per_node;
  env.push_back(fmt::format("RANK={}", rank));
  env.push_back(fmt::format("LOCAL_RANK={}", rank));
  env.push_back(fmt::format("WORLD_SIZE={}", world));
  env.push_back(fmt::format("LOCAL_WORLD_SIZE={}", world));
  env.push_back("GROUP_RANK=0");
  env.push_back(fmt::format("ROLE_RANK={}", rank));
  env.push_back("MASTER_ADDR=" + options.master_addr);
  env.push_back(fmt::format("MASTER_PORT={}", options.master_port));
  env.push_back("TORCHELASTIC_RESTART_COUNT=0");
  if (world > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) env.push_back("OMP_NUM_THREADS=1");
  return env;
}

/// Forks and execs one worker. The child gets its own process group (so a
/// signal to the group reaches its children too) and dies with ddprun.
void spawn(Worker& worker, const LaunchOptions& options, const sigset_t& parent_mask) {
  int out[2];
  int err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    throw std::runtime_error(fmt::format("ddprun: pipe failed: {}", std::strerror(errno)));
  }
  std::vector<std::string> env = worker_environment(options, worker.rank);
  std::vector<char*> envp;
  for (auto& item : env) envp.push_back(item.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = options.command;
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);

  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(fmt::format("ddprun: fork failed: {}", std::strerror(errno)));
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);  // ddprun died before prctl took effect
    ::sigprocmask(SIG_SETMASK, &parent_mask, nullptr);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    ::execvpe(argv[0], argv.data(), envp.data());
    std::fprintf(stderr, "ddprun: cannot execute %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so the group exists before we may signal it
  ::close(out[1]);
  ::close(err[1]);
  worker.pid = pid;
  worker.running = true;
  worker.started = Clock::now();
  worker.out_fd = out[0];
  worker.err_fd = err[0];
}

void relay(Worker& worker, bool is_err, const char* data, size_t size) {
  std::string& partial = is_err ? worker.err_partial : worker.out_partial;
  partial.append(data, size);
  size_t newline;
  while ((newline = partial.find('\n')) != std::string::npos) {
    const std::string line = partial.substr(0, newline);
    partial.erase(0, newline + 1);
    std::FILE* stream = is_err ? stderr : stdout;
    std::fprintf(stream, "[rank%d]: %s\n", worker.rank, line.c_str());
    std::fflush(stream);
    if (is_err) {
      if (worker.first_error_line.empty() && looks_like_error(line)) worker.first_error_line = line;
      if (!line.empty()) worker.last_error_line = line;
    }
  }
}

void drain(Worker& worker, int& fd, bool is_err) {
  char buffer[65536];
  const ssize_t n = ::read(fd, buffer, sizeof(buffer));
  if (n > 0) {
    relay(worker, is_err, buffer, static_cast<size_t>(n));
  } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
    std::string& partial = is_err ? worker.err_partial : worker.out_partial;
    if (!partial.empty()) relay(worker, is_err, "\n", 1);
    ::close(fd);
    fd = -1;
  }
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "ended";
}

bool failed(const Worker& worker) { return !(WIFEXITED(worker.status) && WEXITSTATUS(worker.status) == 0); }

void signal_all(std::vector<Worker>& workers, int signal) {
  for (auto& worker : workers) {
    if (worker.running) ::kill(-worker.pid, signal);
  }
}

}  // namespace

int supervise(const LaunchOptions& options) {
  // Signals arrive through a signalfd, so one poll() loop handles worker
  // output, worker exits and ddprun's own SIGINT/SIGTERM without races.
  sigset_t handled;
  sigemptyset(&handled);
  for (int signal : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&handled, signal);
  sigset_t previous;
  ::sigprocmask(SIG_BLOCK, &handled, &previous);
  const int signal_fd = ::signalfd(-1, &handled, SFD_CLOEXEC);
  if (signal_fd < 0) throw std::runtime_error(fmt::format("ddprun: signalfd failed: {}", std::strerror(errno)));

  if (options.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    std::fprintf(stderr,
                 "ddprun: OMP_NUM_THREADS is unset; setting it to 1 for each of the %d workers so they do not "
                 "oversubscribe the CPU. Set it yourself to tune.\n",
                 options.nproc_per_node);
  }

  std::vector<Worker> workers(static_cast<size_t>(options.nproc_per_node));
  for (int rank = 0; rank < options.nproc_per_node; ++rank) {
    workers[static_cast<size_t>(rank)].rank = rank;
    spawn(workers[static_cast<size_t>(rank)], options, previous);
  }

  int first_failed = -1;
  int stop_signal = 0;  // a signal ddprun received and forwarded
  bool tearing_down = false;
  Clock::time_point kill_at{};
  const auto begin_teardown = [&](int signal) {
    if (tearing_down) return;
    tearing_down = true;
    signal_all(workers, signal);
    kill_at = Clock::now() + options.grace_period;
  };

  for (;;) {
    const bool any_running = std::any_of(workers.begin(), workers.end(), [](const Worker& w) { return w.running; });
    const bool any_open = std::any_of(workers.begin(), workers.end(),
                                      [](const Worker& w) { return w.out_fd >= 0 || w.err_fd >= 0; });
    if (!any_running && !any_open) break;

    std::vector<pollfd> fds{{signal_fd, POLLIN, 0}};
    std::vector<std::pair<Worker*, bool>> owners{{nullptr, false}};
    for (auto& worker : workers) {
      if (worker.out_fd >= 0) fds.push_back({worker.out_fd, POLLIN, 0}), owners.push_back({&worker, false});
      if (worker.err_fd >= 0) fds.push_back({worker.err_fd, POLLIN, 0}), owners.push_back({&worker, true});
    }
    int timeout_ms = 1000;
    if (tearing_down && any_running) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(kill_at - Clock::now()).count();
      timeout_ms = static_cast<int>(std::max<long>(0, std::min<long>(left, 1000)));
    }
    ::poll(fds.data(), fds.size(), timeout_ms);

    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        Worker& worker = *owners[i].first;
        drain(worker, owners[i].second ? worker.err_fd : worker.out_fd, owners[i].second);
      }
    }
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo info;
      while (::read(signal_fd, &info, sizeof(info)) == sizeof(info)) {
        if (info.ssi_signo != SIGCHLD) {
          std::fprintf(stderr, "ddprun: received signal %u (%s); stopping the workers\n", info.ssi_signo,
                       strsignal(static_cast<int>(info.ssi_signo)));
          stop_signal = static_cast<int>(info.ssi_signo);
          begin_teardown(stop_signal);
        }
        break;
      }
    }
    // Reap every worker that ended.
    for (auto& worker : workers) {
      if (!worker.running) continue;
      int status = 0;
      if (::waitpid(worker.pid, &status, WNOHANG) == worker.pid) {
        worker.running = false;
        worker.status = status;
        worker.ended = Clock::now();
        ::kill(-worker.pid, SIGKILL);  // whatever the worker left behind in its group
        if (failed(worker) && !tearing_down) {
          first_failed = worker.rank;
          std::fprintf(stderr, "ddprun: rank %d %s; stopping the other workers\n", worker.rank,
                       describe_status(status).c_str());
          begin_teardown(SIGTERM);
        }
      }
    }
    if (tearing_down && any_running && Clock::now() >= kill_at) signal_all(workers, SIGKILL);
  }
  ::close(signal_fd);
  ::sigprocmask(SIG_SETMASK, &previous, nullptr);

  std::fprintf(stderr, "ddprun: summary\n");
  for (const auto& worker : workers) {
    const double seconds = std::chrono::duration<double>(worker.ended - worker.started).count();
    std::string line = fmt::format("  rank {}: {} after {:.1f} s", worker.rank, describe_status(worker.status), seconds);
    if (failed(worker)) {
      const std::string& error = worker.first_error_line.empty() ? worker.last_error_line : worker.first_error_line;
      if (!error.empty()) line += fmt::format("; first error: {}", error);
    }
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  if (stop_signal != 0) return 128 + stop_signal;
  if (first_failed >= 0) {
    std::fprintf(stderr, "ddprun: job failed: rank %d failed first\n", first_failed);
    return 1;
  }
  return 0;
}

}  // namespace ddp::launcher
