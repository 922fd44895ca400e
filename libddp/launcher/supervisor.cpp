#include "launcher/supervisor.h"

#include "launcher/group_keeper.h"
#include "launcher/orphans.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "launcher/ports.h"

namespace ddp::launcher {
namespace {

using Clock = std::chrono::steady_clock;

std::runtime_error system_error(const std::string& call) {
  return std::runtime_error(fmt::format("ddprun: {} failed: {}", call, std::strerror(errno)));
}

struct Worker {
  int local_rank = 0;
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
  std::string log_path;         // empty: output goes to the console
  std::FILE* log = nullptr;
  std::string first_error_line;
  std::string last_error_line;
};

/// One round of the local workers; a restart starts a new one.
struct Attempt {
  int restart_count = 0;
  int master_port = 0;
  /// --standalone: the rendezvous port, held listening until rank 0 is started with the socket.
  ReservedPort store_port;
  std::vector<Worker> workers;
  int first_failed = -1;  // rank of the worker that failed first
  int stop_signal = 0;    // a signal ddprun received and forwarded
};

bool looks_like_error(const std::string& line) {
  std::string lower = line;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower.find("error") != std::string::npos || lower.find("exception") != std::string::npos ||
         lower.find("terminate") != std::string::npos || lower.find("what():") != std::string::npos;
}

/// ddprun's own environment with the job's coordinates replaced; everything
/// else (NCCL_*, CUDA_VISIBLE_DEVICES, ...) passes through as it is.
std::vector<std::string> worker_environment(const LaunchOptions& options, const Attempt& attempt,
                                            const Worker& worker) {
  const int world = options.nnodes * options.nproc_per_node;
  std::vector<std::string> owned = {
      fmt::format("RANK={}", worker.rank),
      fmt::format("LOCAL_RANK={}", worker.local_rank),
      fmt::format("WORLD_SIZE={}", world),
      fmt::format("LOCAL_WORLD_SIZE={}", options.nproc_per_node),
      fmt::format("GROUP_RANK={}", options.node_rank),
      fmt::format("GROUP_WORLD_SIZE={}", options.nnodes),
      fmt::format("ROLE_RANK={}", worker.rank),
      fmt::format("ROLE_WORLD_SIZE={}", world),
      "MASTER_ADDR=" + options.master_addr,
      fmt::format("MASTER_PORT={}", attempt.master_port),
      fmt::format("TORCHELASTIC_RESTART_COUNT={}", attempt.restart_count),
      fmt::format("TORCHELASTIC_MAX_RESTARTS={}", options.max_restarts),
  };
  if (options.rdzv_timeout_s > 0) owned.push_back(fmt::format("DDP_RDZV_TIMEOUT={}", options.rdzv_timeout_s));
  if (options.timeout_s > 0) owned.push_back(fmt::format("DDP_TIMEOUT={}", options.timeout_s));
  if (!options.rdzv_id.empty()) owned.push_back("TORCHELASTIC_RUN_ID=" + options.rdzv_id);
  if (!options.rdzv_token.empty()) owned.push_back("DDP_RDZV_TOKEN=" + options.rdzv_token);
  if (options.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) owned.push_back("OMP_NUM_THREADS=1");
  if (worker.rank == 0 && attempt.store_port.fd() >= 0) {
    owned.push_back(fmt::format("DDP_STORE_LISTEN_FD={}", attempt.store_port.fd()));
  }

  const auto is_owned = [&](const std::string& name) {
    // A DDP_STORE_LISTEN_FD of ddprun's own environment names no socket of this job.
    return name == "DDP_STORE_LISTEN_FD" || std::any_of(owned.begin(), owned.end(), [&](const std::string& item) {
             return item.compare(0, item.find('='), name) == 0;
           });
  };
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string item = *entry;
    if (!is_owned(item.substr(0, item.find('=')))) env.push_back(item);
  }
  env.insert(env.end(), owned.begin(), owned.end());
  return env;
}

/// In the forked child: reports a failed call on the (redirected) stderr and
/// exits with the shell's "cannot execute" code.
[[noreturn]] void child_failed(const char* call) {
  std::fprintf(stderr, "ddprun: %s failed in the worker before exec: %s\n", call, std::strerror(errno));
  ::_exit(127);
}

/// Forks and execs one worker. The child gets its own process group (so a
/// signal to the group reaches its children too) and dies with ddprun.
void spawn(Worker& worker, const LaunchOptions& options, const Attempt& attempt, const sigset_t& worker_mask,
           GroupKeeper& keeper) {
  int out[2];
  int err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw system_error("pipe2");
  if (::pipe2(err, O_CLOEXEC) != 0) throw system_error("pipe2");
  std::vector<std::string> env = worker_environment(options, attempt, worker);
  std::vector<char*> envp;
  for (auto& item : env) envp.push_back(item.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = options.command;
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);

  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw system_error("fork");
  if (pid == 0) {
    if (::setpgid(0, 0) != 0) child_failed("setpgid");
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) child_failed("prctl(PR_SET_PDEATHSIG)");
    if (::getppid() != parent) ::_exit(1);  // ddprun died before prctl took effect
    if (::sigprocmask(SIG_SETMASK, &worker_mask, nullptr) != 0) child_failed("sigprocmask");
    if (::dup2(out[1], STDOUT_FILENO) < 0) child_failed("dup2");
    if (::dup2(err[1], STDERR_FILENO) < 0) child_failed("dup2");
    // No worker reads ddprun's input: in a group of its own, one that read
    // the terminal would be stopped (SIGTTIN) and the job would wait forever.
    const int nothing = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (nothing < 0 || ::dup2(nothing, STDIN_FILENO) < 0) child_failed("stdin from /dev/null");
    ::signal(SIGPIPE, SIG_DFL);  // ddprun ignores it, and an ignored signal stays ignored across exec
    // Rank 0's store serves on the reserved socket (DDP_STORE_LISTEN_FD): it stays open across exec.
    if (worker.rank == 0 && attempt.store_port.fd() >= 0 && ::fcntl(attempt.store_port.fd(), F_SETFD, 0) != 0) {
      child_failed("fcntl(F_SETFD) of the rendezvous socket");
    }
    ::execvpe(argv[0], argv.data(), envp.data());
    std::fprintf(stderr, "ddprun: cannot execute %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  // Also here, so the group exists before we may signal it. EACCES: the child
  // has exec'd already, so its own setpgid has run.
  if (::setpgid(pid, pid) != 0 && errno != EACCES) throw system_error("setpgid");
  keeper.hold(pid);
  if (::close(out[1]) != 0) throw system_error("close");
  if (::close(err[1]) != 0) throw system_error("close");
  worker.pid = pid;
  worker.running = true;
  worker.started = Clock::now();
  worker.out_fd = out[0];
  worker.err_fd = err[0];
}

void write_line(std::FILE* stream, const std::string& text) {
  if (std::fputs(text.c_str(), stream) < 0 || std::fflush(stream) != 0) {
    throw system_error("writing worker output");
  }
}

void relay(Worker& worker, bool is_err, const char* data, size_t size, bool to_console) {
  std::string& partial = is_err ? worker.err_partial : worker.out_partial;
  partial.append(data, size);
  size_t newline;
  while ((newline = partial.find('\n')) != std::string::npos) {
    const std::string line = partial.substr(0, newline);
    partial.erase(0, newline + 1);
    if (worker.log != nullptr) write_line(worker.log, line + "\n");
    if (to_console) write_line(is_err ? stderr : stdout, fmt::format("[rank{}]: {}\n", worker.rank, line));
    if (is_err) {
      if (worker.first_error_line.empty() && looks_like_error(line)) worker.first_error_line = line;
      if (!line.empty()) worker.last_error_line = line;
    }
  }
}

void drain(Worker& worker, int& fd, bool is_err, bool to_console) {
  char buffer[65536];
  const ssize_t n = ::read(fd, buffer, sizeof(buffer));
  if (n < 0 && errno == EINTR) return;
  if (n > 0) {
    relay(worker, is_err, buffer, static_cast<size_t>(n), to_console);
    return;
  }
  if (n < 0) std::fprintf(stderr, "ddprun: read of rank %d's output failed: %s\n", worker.rank, std::strerror(errno));
  std::string& partial = is_err ? worker.err_partial : worker.out_partial;
  if (!partial.empty()) relay(worker, is_err, "\n", 1, to_console);
  if (::close(fd) != 0) throw system_error("close");
  fd = -1;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "ended";
}

bool failed(const Worker& worker) { return !(WIFEXITED(worker.status) && WEXITSTATUS(worker.status) == 0); }

void signal_all(std::vector<Worker>& workers, int signal) {
  for (auto& worker : workers) {
    // ESRCH: the group is gone already, which is what we want.
    if (worker.running && ::kill(-worker.pid, signal) != 0 && errno != ESRCH) throw system_error("kill");
    // A stopped worker (kill -STOP, a debugger) would hold the signal until
    // the grace period ran out: let it run to act on it.
    if (worker.running && signal != SIGKILL && ::kill(-worker.pid, SIGCONT) != 0 && errno != ESRCH) {
      throw system_error("kill");
    }
  }
}

void open_logs(const LaunchOptions& options, Attempt& attempt) {
  if (options.log_dir.empty()) return;
  const std::string dir = fmt::format("{}/attempt_{}", options.log_dir, attempt.restart_count);
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) throw std::runtime_error(fmt::format("ddprun: cannot create {}: {}", dir, error.message()));
  for (auto& worker : attempt.workers) {
    worker.log_path = fmt::format("{}/rank_{}.log", dir, worker.rank);
    worker.log = std::fopen(worker.log_path.c_str(), "w");
    if (worker.log == nullptr) throw system_error("fopen " + worker.log_path);
  }
  std::fprintf(stderr, "ddprun: output of ranks %d-%d goes to %s/rank_N.log%s\n", attempt.workers.front().rank,
               attempt.workers.back().rank, dir.c_str(), options.tee ? " and to the console" : "");
}

void close_logs(Attempt& attempt) {
  for (auto& worker : attempt.workers) {
    if (worker.log != nullptr && std::fclose(worker.log) != 0) throw system_error("fclose " + worker.log_path);
    worker.log = nullptr;
  }
}

/// Runs the local workers until all have ended: the first failure or a signal
/// to ddprun stops the rest (the signal itself, or SIGTERM; SIGKILL after the
/// grace period, or at once on a second signal).
void run_attempt(const LaunchOptions& options, Attempt& attempt, int signal_fd, const sigset_t& worker_mask,
                 GroupKeeper& keeper, const std::vector<pid_t>& spared) {
  const bool to_console = options.log_dir.empty() || options.tee;
  attempt.workers.resize(static_cast<size_t>(options.nproc_per_node));
  for (int local_rank = 0; local_rank < options.nproc_per_node; ++local_rank) {
    Worker& worker = attempt.workers[static_cast<size_t>(local_rank)];
    worker.local_rank = local_rank;
    worker.rank = options.node_rank * options.nproc_per_node + local_rank;
  }
  open_logs(options, attempt);
  for (auto& worker : attempt.workers) spawn(worker, options, attempt, worker_mask, keeper);
  // Rank 0 holds the socket now. ddprun's copy would keep the port accepting connections nobody answers once
  // rank 0 is gone (a survivor reading the store would wait for its timeout instead of being refused).
  attempt.store_port.close();

  auto& workers = attempt.workers;
  bool tearing_down = false;
  Clock::time_point kill_at{};
  const auto begin_teardown = [&](int signal) {
    if (tearing_down) {
      signal_all(workers, SIGKILL);
      return;
    }
    tearing_down = true;
    signal_all(workers, signal);
    kill_at = Clock::now() + options.grace_period;
  };

  bool orphans_killed = false;
  for (;;) {
    const bool any_running = std::any_of(workers.begin(), workers.end(), [](const Worker& w) { return w.running; });
    if (!any_running && !orphans_killed) {
      // Descendants that left their worker's group (setsid) came to ddprun
      // when their parents died; they may hold the workers' pipes open.
      orphans_killed = true;
      if (const int orphans = kill_orphans(spared); orphans > 0) {
        std::fprintf(stderr, "ddprun: killed %d process(es) the workers left behind outside their process groups\n",
                     orphans);
      }
    }
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
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) throw system_error("poll");

    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        Worker& worker = *owners[i].first;
        drain(worker, owners[i].second ? worker.err_fd : worker.out_fd, owners[i].second, to_console);
      }
    }
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo info;
      if (::read(signal_fd, &info, sizeof(info)) != sizeof(info)) throw system_error("read of the signalfd");
      if (info.ssi_signo != SIGCHLD) {
        std::fprintf(stderr, "ddprun: received signal %u (%s); stopping the workers%s\n", info.ssi_signo,
                     strsignal(static_cast<int>(info.ssi_signo)),
                     tearing_down ? " now (SIGKILL)" : "; a second signal kills them at once");
        attempt.stop_signal = static_cast<int>(info.ssi_signo);
        begin_teardown(attempt.stop_signal);
      }
    }
    // Reap every worker that ended.
    for (auto& worker : workers) {
      if (!worker.running) continue;
      int status = 0;
      const pid_t reaped = ::waitpid(worker.pid, &status, WNOHANG);
      if (reaped < 0) throw system_error("waitpid");
      if (reaped != worker.pid) continue;
      worker.running = false;
      worker.status = status;
      worker.ended = Clock::now();
      // Whatever the worker left behind in its group.
      if (::kill(-worker.pid, SIGKILL) != 0 && errno != ESRCH) throw system_error("kill");
      if (failed(worker) && !tearing_down) {
        attempt.first_failed = worker.rank;
        std::fprintf(stderr, "ddprun: rank %d %s; stopping the other workers\n", worker.rank,
                     describe_status(status).c_str());
        begin_teardown(SIGTERM);
      }
    }
    if (tearing_down && any_running && Clock::now() >= kill_at) signal_all(workers, SIGKILL);
  }
  close_logs(attempt);
}

void print_summary(const LaunchOptions& options, const Attempt& attempt) {
  std::fprintf(stderr, "ddprun: summary of attempt %d of at most %d (TORCHELASTIC_RESTART_COUNT=%d, port %d)\n",
               attempt.restart_count + 1, options.max_restarts + 1, attempt.restart_count, attempt.master_port);
  for (const auto& worker : attempt.workers) {
    const double seconds = std::chrono::duration<double>(worker.ended - worker.started).count();
    std::string line = fmt::format("  rank {}: {} after {:.1f} s", worker.rank, describe_status(worker.status), seconds);
    if (failed(worker)) {
      const std::string& error = worker.first_error_line.empty() ? worker.last_error_line : worker.first_error_line;
      if (!error.empty()) line += fmt::format("; first error: {}", error);
      if (!worker.log_path.empty()) line += fmt::format(" (log: {})", worker.log_path);
    }
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

/// The signals that stop the job: those ddprun does not ignore, so that
/// `nohup ddprun` keeps running when the terminal goes away.
sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int signal : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction current {};
    if (::sigaction(signal, nullptr, &current) != 0) throw system_error("sigaction");
    if (current.sa_handler != SIG_IGN) sigaddset(&set, signal);
  }
  return set;
}

}  // namespace

int supervise(const LaunchOptions& options) {
  // Signals arrive through a signalfd, so one poll() loop handles worker
  // output, worker exits and ddprun's own SIGINT/SIGTERM without races.
  sigset_t handled = stop_signals();
  sigaddset(&handled, SIGCHLD);
  sigset_t previous;
  if (::sigprocmask(SIG_BLOCK, &handled, &previous) != 0) throw system_error("sigprocmask");
  const int signal_fd = ::signalfd(-1, &handled, SFD_CLOEXEC);
  if (signal_fd < 0) throw system_error("signalfd");
  // A reader of ddprun's output that goes away (`ddprun ... | head`) makes the
  // next write fail with EPIPE, which ends the job with a message, instead of
  // a SIGPIPE that kills ddprun without one.
  ::signal(SIGPIPE, SIG_IGN);

  // --standalone: a port held from its pick until rank 0's store serves on it; a fresh one for each attempt.
  ReservedPort store_port = options.standalone ? ReservedPort::on_loopback() : ReservedPort();
  const std::string source = options.slurm_job_id.empty() ? "" : " (from SLURM job " + options.slurm_job_id + ")";
  std::fprintf(stderr, "ddprun: node %d of %d%s: starting ranks %d-%d of %d, rendezvous at %s:%d\n", options.node_rank,
               options.nnodes, source.c_str(), options.node_rank * options.nproc_per_node,
               (options.node_rank + 1) * options.nproc_per_node - 1, options.nnodes * options.nproc_per_node,
               options.master_addr.c_str(), options.standalone ? store_port.port() : options.master_port);
  if (options.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    std::fprintf(stderr,
                 "ddprun: OMP_NUM_THREADS is unset; setting it to 1 for each of the %d workers so they do not "
                 "oversubscribe the CPU. Set it yourself to tune.\n",
                 options.nproc_per_node);
  }

  // Children of whoever exec'd ddprun are not the job's to kill.
  std::vector<pid_t> spared = children();
  // Kills the workers' groups, grandchildren included, should ddprun itself be killed.
  GroupKeeper keeper;
  spared.push_back(keeper.pid());
  become_subreaper();
  int exit_code = 0;
  for (int restart = 0;; ++restart) {
    Attempt attempt;
    attempt.restart_count = restart;
    attempt.master_port = options.standalone ? store_port.port() : options.master_port;
    attempt.store_port = std::move(store_port);
    run_attempt(options, attempt, signal_fd, previous, keeper, spared);
    print_summary(options, attempt);
    if (attempt.stop_signal != 0) {
      exit_code = 128 + attempt.stop_signal;
      break;
    }
    if (attempt.first_failed < 0) {
      if (restart > 0) std::fprintf(stderr, "ddprun: job succeeded after %d restart(s)\n", restart);
      break;
    }
    if (restart == options.max_restarts) {
      const std::string attempts = restart > 0 ? fmt::format(" in the last of {} attempts", restart + 1) : "";
      std::fprintf(stderr, "ddprun: job failed: rank %d failed first%s\n", attempt.first_failed, attempts.c_str());
      exit_code = 1;
      break;
    }
    // A fresh rendezvous: with --standalone a new port, so a store of the
    // failed attempt that is still closing cannot be joined by mistake.
    if (options.standalone) store_port = ReservedPort::on_loopback();
    std::fprintf(stderr, "ddprun: restarting all %d local workers (restart %d of %d)\n", options.nproc_per_node,
                 restart + 1, options.max_restarts);
  }
  keeper.release();  // every worker was reaped; an exception above leaves the keeper to kill them
  if (::close(signal_fd) != 0) throw system_error("close of the signalfd");
  if (::sigprocmask(SIG_SETMASK, &previous, nullptr) != 0) throw system_error("sigprocmask");
  return exit_code;
}

}  // namespace ddp::launcher
