#include "launcher/doctor.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "launcher/launch_options.h"

extern char** environ;

namespace ddp::launcher {
namespace {

constexpr const char* kProbeName = "ddp_doctor_probe";
constexpr int kProbeSeconds = 240;  // past the workers' own 60 s deadlines

/// SIGINT, SIGTERM or SIGHUP that asked the doctor to stop (0: none): it stops the probe job, removes its scratch
/// folder, and then dies of the signal. A second one kills the probe job at once (`stop_signals` counts them).
volatile sig_atomic_t stop_signal = 0;
volatile sig_atomic_t stop_signals = 0;

void note_stop_signal(int signal) {
  stop_signal = signal;
  stop_signals = stop_signals + 1;
}

/// Catches the stop signals that are not ignored: under nohup SIGHUP stays ignored, as for any program.
void catch_stop_signals() {
  struct sigaction action {};
  action.sa_handler = note_stop_signal;
  ::sigemptyset(&action.sa_mask);
  for (const int signal : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction current {};
    if (::sigaction(signal, nullptr, &current) == 0 && current.sa_handler == SIG_IGN) continue;
    ::sigaction(signal, &action, nullptr);
  }
}

[[noreturn]] void die_of_stop_signal() {
  const int signal = stop_signal;
  ::signal(signal, SIG_DFL);
  ::raise(signal);
  ::_exit(128 + signal);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

/// The last non-empty line of each rank's log: where a failed probe stopped.
std::string last_lines(const std::string& log_dir) {
  std::string lines;
  std::error_code error;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(log_dir, error)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path());
    std::string line, last;
    while (std::getline(in, line)) {
      if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
    }
    if (!last.empty()) lines += (lines.empty() ? "" : " | ") + entry.path().stem().string() + ": " + last;
  }
  return lines;
}

/// Runs the probe as a job of this ddprun, its output into `scratch`.
std::vector<Check> run_probe(const std::string& scratch, int workers, bool several_gpus_without_nvls_setting) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string probe = (std::filesystem::path(self).parent_path() / kProbeName).string();
  if (::access(probe.c_str(), X_OK) != 0) {
    return {{CheckStatus::kWarning, "worker probe",
             probe + " is missing, so the libraries and collectives went unchecked",
             "install ddprun together with ddp_doctor_probe (cmake --install puts both in bin/)"}};
  }
  const std::string report = scratch + "/report.tsv";
  const std::string logs = scratch + "/logs";
  std::vector<std::string> args{self,
                                "--standalone",
                                "--nproc-per-node",
                                std::to_string(workers),
                                "--timeout",
                                "60",
                                "--rdzv-timeout",
                                "60",
                                "--log-dir",
                                logs,
                                probe};
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_text{"DDP_DOCTOR_REPORT=" + report};
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (std::string(*entry).rfind("DDP_DOCTOR_REPORT=", 0) != 0) env_text.emplace_back(*entry);
  }
  std::vector<char*> envp;
  for (auto& entry : env_text) envp.push_back(entry.data());
  envp.push_back(nullptr);

  const std::string output = scratch + "/ddprun.out";
  const pid_t doctor = ::getpid();
  if (stop_signal != 0) return {};  // stopped before the probe began: no job to start and stop
  const pid_t pid = ::fork();
  if (pid < 0) {
    return {{CheckStatus::kFailure, "worker probe", fmt::format("could not start {}: {}", self, std::strerror(errno)),
             "check that ddprun can start programs here"}};
  }
  if (pid == 0) {
    // The probe job ends with the doctor, however the doctor ends (a
    // signal, a kill): its ddprun stops its workers on SIGTERM.
    // What the doctor inherited, until execve resets the caught ones (an ignored signal stays ignored).
    for (const int signal : {SIGINT, SIGTERM, SIGHUP}) {
      if (::signal(signal, SIG_DFL) == SIG_IGN) ::signal(signal, SIG_IGN);
    }
    if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || ::getppid() != doctor) ::_exit(126);
    const int out = ::open(output.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0 || ::dup2(out, STDOUT_FILENO) < 0 || ::dup2(out, STDERR_FILENO) < 0) ::_exit(126);
    ::execve(self.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kProbeSeconds);
  bool timed_out = false;
  bool stopping = false;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if ((stop_signal != 0 || std::chrono::steady_clock::now() > deadline) && !stopping) {
      ::kill(pid, SIGTERM);  // ddprun stops its workers and exits
      timed_out = stop_signal == 0;
      stopping = true;
    }
    if (stop_signals > 1) ::kill(pid, SIGKILL);  // asked twice: its workers die with it (parent-death signal)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::vector<Check> checks = parse_probe_report(read_text(report));
  const bool succeeded = !timed_out && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!succeeded) {
    std::string where = last_lines(logs);
    if (where.empty()) where = read_text(output);
    std::string fix = "NCCL_DEBUG=INFO ddprun --doctor shows where it stopped; the rank logs are in " + logs;
    if (several_gpus_without_nvls_setting) fix = "if it hung at set-up, try NCCL_NVLS_ENABLE=0; " + fix;
    checks.push_back(
        {CheckStatus::kFailure, "worker probe",
         fmt::format("a {}-worker job {}: {}", workers,
                     timed_out ? fmt::format("did not finish in {} s", kProbeSeconds) : "failed", where.substr(0, 600)),
         fix});
  }
  return checks;
}

}  // namespace

std::vector<Check> parse_probe_report(const std::string& text) {
  std::vector<Check> checks;
  std::stringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::vector<std::string> fields;
    std::stringstream parts(line);
    for (std::string field; std::getline(parts, field, '\t');) fields.push_back(field);
    if (fields.size() < 3) continue;
    Check check;
    check.status = fields[0] == "ok"        ? CheckStatus::kOk
                   : fields[0] == "warning" ? CheckStatus::kWarning
                   : fields[0] == "failure" ? CheckStatus::kFailure
                                            : CheckStatus::kInfo;
    check.name = fields[1];
    check.detail = fields[2];
    if (fields.size() > 3) check.fix = fields[3];
    checks.push_back(check);
  }
  return checks;
}

std::string render_report(const std::vector<Check>& checks, bool json) {
  int failures = 0, warnings = 0;
  for (const Check& check : checks) {
    failures += check.status == CheckStatus::kFailure;
    warnings += check.status == CheckStatus::kWarning;
  }
  std::string out;
  if (json) {
    out = fmt::format("{{\"ok\": {}, \"failures\": {}, \"warnings\": {}, \"checks\": [", failures == 0, failures,
                      warnings);
    for (std::size_t i = 0; i < checks.size(); ++i) {
      out += fmt::format("{}{{\"status\": {}, \"name\": {}, \"detail\": {}, \"fix\": {}}}", i ? ", " : "",
                         json_string(to_string(checks[i].status)), json_string(checks[i].name),
                         json_string(checks[i].detail), json_string(checks[i].fix));
    }
    return out + "]}\n";
  }
  out = "ddprun --doctor: the machine, the libraries and a collective, as a job would see them\n";
  for (const Check& check : checks) {
    out += fmt::format("  {:<8} {}: {}\n", to_string(check.status), check.name, check.detail);
    if (!check.fix.empty()) out += fmt::format("  {:<8} fix: {}\n", "", check.fix);
  }
  out += failures > 0 ? fmt::format("{} problem(s) would stop a job; {} warning(s)\n", failures, warnings)
                      : fmt::format("nothing found that would stop a job; {} warning(s)\n", warnings);
  return out;
}

int run_doctor(const std::vector<std::string>& args) {
  bool json = false;
  for (const std::string& arg : args) {
    if (arg == "--json") {
      json = true;
    } else if (arg != "--doctor") {
      std::fprintf(stderr, "ddprun: error: --doctor takes only --json, got '%s'\n", arg.c_str());
      return 2;
    }
  }
  const HostFacts facts = read_host_facts();
  std::vector<Check> checks = host_checks(facts);
  const char* tmpdir = std::getenv("TMPDIR");
  const std::string temporary = tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp";
  std::string scratch = temporary + "/ddprun-doctor-XXXXXX";
  catch_stop_signals();
  if (::mkdtemp(scratch.data()) == nullptr) {
    checks.push_back({CheckStatus::kFailure, "temporary folder",
                      fmt::format("mkdtemp in {} failed: {}", temporary, std::strerror(errno)),
                      "make " + temporary + " writable, or point TMPDIR to a writable folder"});
  } else {
    const int gpus = visible_gpu_count();
    const bool nvls_unset = gpus > 1 && facts.env.count("NCCL_NVLS_ENABLE") == 0;
    bool probe_failed = false;
    for (Check& check : run_probe(scratch, gpus > 0 ? gpus : 2, nvls_unset)) {
      probe_failed = probe_failed || check.status == CheckStatus::kFailure;
      checks.push_back(std::move(check));
    }
    std::error_code error;
    // A failed probe's logs are named in the report; a stopped doctor reports nothing.
    if (!probe_failed || stop_signal != 0) std::filesystem::remove_all(scratch, error);
  }
  // From here a stop signal acts as it would on any program; one that came before stops the doctor now.
  for (const int signal : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction current {};
    if (::sigaction(signal, nullptr, &current) == 0 && current.sa_handler == note_stop_signal) {
      ::signal(signal, SIG_DFL);
    }
  }
  if (stop_signal != 0) die_of_stop_signal();
  std::fputs(render_report(checks, json).c_str(), stdout);
  for (const Check& check : checks) {
    if (check.status == CheckStatus::kFailure) return 1;
  }
  return 0;
}

}  // namespace ddp::launcher
