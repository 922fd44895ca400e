#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddp::launcher::testing {

/// A fresh folder under the temporary directory, removed with its contents.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }
  /// Names of the files directly in it, sorted.
  std::vector<std::string> files() const;

 private:
  std::string path_;
};

/// Variables to set (a value) or unset (nullopt) for ddprun, on top of the
/// test's environment with every SLURM_* removed.
using EnvChanges = std::map<std::string, std::optional<std::string>>;

/// What start_ddprun leaves waiting on ddprun's stdin.
inline constexpr const char* kDdprunInput = "typed at ddprun's terminal";

/// A ddprun started in the background; its stdout and stderr go to
/// SCRATCH/ddprun.out, so one ScratchDir serves one ddprun at a time.
struct DdprunProcess {
  pid_t pid = -1;
  std::string output_path;
};

struct DdprunResult {
  int exit_code = -1;  ///< -1 when killed by a signal
  int signal = 0;
  std::string output;
  double seconds = 0;
};

DdprunProcess start_ddprun(const std::vector<std::string>& args, const ScratchDir& scratch,
                           const EnvChanges& env = {});

/// Waits for ddprun to end; past the timeout it is killed and the result says
/// so with exit_code -1 and signal SIGKILL.
DdprunResult wait_ddprun(const DdprunProcess& process, std::chrono::seconds timeout);

DdprunResult run_ddprun(const std::vector<std::string>& args, const ScratchDir& scratch, const EnvChanges& env = {},
                        std::chrono::seconds timeout = std::chrono::seconds(30));

/// The pids the probe wrote to DIR/pid_<rank>, once `count` exist (or the
/// timeout passed: then fewer).
std::vector<pid_t> wait_for_pid_files(const std::string& dir, size_t count, std::chrono::seconds timeout);

/// True while `pid` exists and is not a zombie.
bool alive(pid_t pid);

/// Waits until none of `pids` is alive; returns those still alive at the
/// timeout, after SIGKILLing them so that no test leaves processes behind.
std::vector<pid_t> wait_until_dead(const std::vector<pid_t>& pids, std::chrono::seconds timeout);

/// The NAME=value lines of a file the probe wrote.
std::map<std::string, std::string> read_env_file(const std::string& path);

/// A socket listening on a free loopback port, so that the port is taken.
class ListeningSocket {
 public:
  ListeningSocket();
  ~ListeningSocket();
  ListeningSocket(const ListeningSocket&) = delete;
  ListeningSocket& operator=(const ListeningSocket&) = delete;
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace ddp::launcher::testing
