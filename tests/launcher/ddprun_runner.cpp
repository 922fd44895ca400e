#include "ddprun_runner.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace ddp::launcher::testing {
namespace {

std::runtime_error system_error(const std::string& call) {
  return std::runtime_error(call + " failed: " + std::strerror(errno));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

ScratchDir::ScratchDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "ddprun_test_XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) throw system_error("mkdtemp");
  path_ = pattern;
}

ScratchDir::~ScratchDir() {
  std::error_code ignored;  // a destructor cannot report; a leftover temp folder is harmless
  std::filesystem::remove_all(path_, ignored);
}

std::vector<std::string> ScratchDir::files() const {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(path_)) {
    const std::string name = entry.path().filename().string();
    if (name != "ddprun.out" && name != "ddprun.in") names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

DdprunProcess start_ddprun(const std::vector<std::string>& args, const ScratchDir& scratch, const EnvChanges& env) {
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string item = *entry;
    const std::string name = item.substr(0, item.find('='));
    if (name.rfind("SLURM_", 0) != 0 && env.count(name) == 0) environment.push_back(item);
  }
  for (const auto& [name, value] : env) {
    if (value) environment.push_back(name + "=" + *value);
  }
  std::vector<std::string> argv_strings{DDPRUN_PATH};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& arg : argv_strings) argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& item : environment) envp.push_back(item.data());
  envp.push_back(nullptr);

  DdprunProcess process;
  process.output_path = scratch.path() + "/ddprun.out";
  const int out = ::open(process.output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) throw system_error("open " + process.output_path);
  // Input waits on ddprun's stdin, as typing at its terminal would leave it: no worker may read it.
  const std::string input_path = scratch.path() + "/ddprun.in";
  std::ofstream(input_path) << kDdprunInput << "\n";
  const int in = ::open(input_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) throw system_error("open " + input_path);
  process.pid = ::fork();
  if (process.pid < 0) throw system_error("fork");
  if (process.pid == 0) {
    // ddprun as a shell would start it in the foreground: default signal
    // handling, whatever the test runner set up.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int signal : {SIGINT, SIGTERM, SIGHUP}) ::signal(signal, SIG_DFL);
    if (::dup2(in, STDIN_FILENO) < 0 || ::dup2(out, STDOUT_FILENO) < 0 || ::dup2(out, STDERR_FILENO) < 0) {
      ::_exit(126);
    }
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  if (::close(out) != 0 || ::close(in) != 0) throw system_error("close");
  return process;
}

DdprunResult wait_ddprun(const DdprunProcess& process, std::chrono::seconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  DdprunResult result;
  int status = 0;
  for (;;) {
    const pid_t reaped = ::waitpid(process.pid, &status, WNOHANG);
    if (reaped < 0) throw system_error("waitpid");
    if (reaped == process.pid) break;
    if (std::chrono::steady_clock::now() - start > timeout) {
      if (::kill(process.pid, SIGKILL) != 0) throw system_error("kill");
      if (::waitpid(process.pid, &status, 0) < 0) throw system_error("waitpid");
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  result.output = read_file(process.output_path);
  return result;
}

DdprunResult run_ddprun(const std::vector<std::string>& args, const ScratchDir& scratch, const EnvChanges& env,
                        std::chrono::seconds timeout) {
  return wait_ddprun(start_ddprun(args, scratch, env), timeout);
}

std::vector<pid_t> wait_for_pid_files(const std::string& dir, size_t count, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<pid_t> pids;
  do {
    pids.clear();
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("pid_", 0) == 0 && name.find(".partial") == std::string::npos) {
        pids.push_back(static_cast<pid_t>(std::stol(read_file(entry.path().string()))));
      }
    }
    if (pids.size() >= count) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (std::chrono::steady_clock::now() < deadline);
  return pids;
}

bool alive(pid_t pid) {
  // The state follows the parenthesised command name in /proc/PID/stat.
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

std::vector<pid_t> wait_until_dead(const std::vector<pid_t>& pids, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<pid_t> living;
  do {
    living.clear();
    for (pid_t pid : pids) {
      if (alive(pid)) living.push_back(pid);
    }
    if (living.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (std::chrono::steady_clock::now() < deadline);
  for (pid_t pid : living) ::kill(pid, SIGKILL);  // cleanup only; the caller reports them
  return living;
}

std::map<std::string, std::string> read_env_file(const std::string& path) {
  std::map<std::string, std::string> env;
  std::istringstream lines(read_file(path));
  std::string line;
  while (std::getline(lines, line)) {
    const size_t equals = line.find('=');
    if (equals != std::string::npos) env[line.substr(0, equals)] = line.substr(equals + 1);
  }
  return env;
}

ListeningSocket::ListeningSocket() {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw system_error("socket");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t length = sizeof(address);
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) throw system_error("bind");
  if (::listen(fd_, 1) != 0) throw system_error("listen");
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) throw system_error("getsockname");
  port_ = ntohs(address.sin_port);
}

ListeningSocket::~ListeningSocket() { ::close(fd_); }

}  // namespace ddp::launcher::testing
