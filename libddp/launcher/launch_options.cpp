#include "launcher/launch_options.h"
#include "launcher/ports.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

namespace ddp::launcher {
namespace {

int parse_int(const std::string& flag, const std::string& text, int low, int high) {
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE) {
    throw LaunchUsageError(fmt::format("{} expects an integer, got '{}'", flag, text));
  }
  if (value < low || value > high) {
    throw LaunchUsageError(fmt::format("{} must be in [{}, {}], got {}", flag, low, high, value));
  }
  return static_cast<int>(value);
}

int parse_nproc(const std::string& text) {
  if (text == "gpu") {
    const int gpus = visible_gpu_count();
    if (gpus == 0) throw LaunchUsageError("--nproc-per-node gpu: no GPU is visible (use cpu or a number)");
    return gpus;
  }
  if (text == "cpu") return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (text == "auto") {
    const int gpus = visible_gpu_count();
    return gpus > 0 ? gpus : 2;
  }
  return parse_int("--nproc-per-node", text, 1, 4096);
}

bool is_executable(const std::string& program) {
  if (program.find('/') != std::string::npos) return ::access(program.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = dirs.find(':', start);
    const std::string dir = dirs.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (::access(((dir.empty() ? "." : dir) + "/" + program).c_str(), X_OK) == 0) return true;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return false;
}

}  // namespace

std::string usage() {
  return R"(usage: ddprun [options] program [args...]

Starts one process per GPU (or N CPU processes) of a libddp or PyTorch job, with
the environment torchrun gives its workers: RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT.
If one worker fails, the others are stopped and ddprun exits non-zero.

options:
  --nproc-per-node N|gpu|cpu|auto  processes on this node (default auto: one per
                                   visible GPU, else 2 CPU processes)
  --master-addr HOST               host of rank 0 (default 127.0.0.1)
  --master-port PORT               port of rank 0's rendezvous store (default 29500)
  --standalone                     single node: loopback and a free port
  --help                           this text
)";
}

LaunchOptions parse_launch_options(const std::vector<std::string>& args, bool& help) {
  LaunchOptions options;
  help = false;
  std::string nproc = "auto";
  bool port_given = false;
  size_t i = 0;
  auto value_of = [&](const std::string& flag) -> std::string {
    if (i + 1 >= args.size()) throw LaunchUsageError(fmt::format("{} needs a value", flag));
    return args[++i];
  };
  for (; i < args.size(); ++i) {
    std::string flag = args[i];
    std::string inline_value;
    const bool has_inline_value = flag.rfind("--", 0) == 0 && flag.find('=') != std::string::npos;
    if (has_inline_value) {
      inline_value = flag.substr(flag.find('=') + 1);
      flag = flag.substr(0, flag.find('='));
    }
    auto value = [&]() { return has_inline_value ? inline_value : value_of(flag); };
    std::replace(flag.begin(), flag.end(), '_', '-');  // torchrun accepts both spellings
    if (flag == "--help" || flag == "-h") {
      help = true;
      return options;
    } else if (flag == "--nproc-per-node") {
      nproc = value();
    } else if (flag == "--master-addr") {
      options.master_addr = value();
    } else if (flag == "--master-port") {
      options.master_port = parse_int("--master-port", value(), 1, 65535);
      port_given = true;
    } else if (flag == "--standalone") {
      options.standalone = true;
    } else if (flag.rfind("-", 0) == 0) {
      throw LaunchUsageError(fmt::format("unknown option '{}'", args[i]));
    } else {
      break;
    }
  }
  options.command.assign(args.begin() + static_cast<long>(i), args.end());
  if (options.command.empty()) throw LaunchUsageError("no program given");
  if (!is_executable(options.command[0])) {
    throw LaunchUsageError(fmt::format("program '{}' does not exist or is not executable", options.command[0]));
  }
  options.nproc_per_node = parse_nproc(nproc);
  if (options.standalone) {
    if (port_given) throw LaunchUsageError("--standalone picks its own port; drop --master-port");
    options.master_addr = "127.0.0.1";
    options.master_port = free_port();
  } else {
    require_port_free(options.master_port);
  }
  return options;
}

int visible_gpu_count() {
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    std::string list = visible;
    if (list.empty() || list == "-1" || list == "NoDevFiles") return 0;
    return static_cast<int>(std::count(list.begin(), list.end(), ',')) + 1;
  }
  std::error_code error;
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", error)) {
    (void)entry;
    ++count;
  }
  return count;
}

}  // namespace ddp::launcher
