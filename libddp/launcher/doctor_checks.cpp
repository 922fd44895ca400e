#include "launcher/doctor_checks.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

extern char** environ;

namespace ddp::launcher {
namespace {

constexpr std::int64_t kMiB = 1 << 20;

std::vector<std::string> entries_of(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

/// The value after "Key:" in a /proc/driver/nvidia file, trimmed.
std::string field_of(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) != 0) continue;
    const auto begin = line.find_first_not_of(" \t", key.size() + 1);
    return begin == std::string::npos ? "" : line.substr(begin);
  }
  return "";
}

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, separator);) items.push_back(item);
  return items;
}

std::string join(const std::vector<std::string>& items) {
  std::string text;
  for (const auto& item : items) text += (text.empty() ? "" : ", ") + item;
  return text.empty() ? "none" : text;
}

std::string size_text(std::int64_t bytes) {
  return bytes >= 1024 * kMiB ? fmt::format("{:.1f} GiB", static_cast<double>(bytes) / (1024.0 * kMiB))
                              : fmt::format("{} MiB", bytes / kMiB);
}

std::string env_or(const HostFacts& facts, const std::string& name, const std::string& fallback = "") {
  const auto it = facts.env.find(name);
  return it == facts.env.end() ? fallback : it->second;
}

Check gpus_check(const HostFacts& facts) {
  if (facts.gpu_models.empty()) {
    return {CheckStatus::kInfo, "GPUs",
            facts.driver_version.empty() ? "no NVIDIA driver: jobs run on the CPU over Gloo"
                                         : "the driver (" + facts.driver_version + ") lists no GPU",
            ""};
  }
  std::map<std::string, int> models;
  for (const auto& model : facts.gpu_models) ++models[model];
  std::vector<std::string> parts;
  for (const auto& [model, count] : models) parts.push_back(fmt::format("{} x {}", count, model));
  return {CheckStatus::kOk, "GPUs", fmt::format("{}, driver {}", join(parts), facts.driver_version), ""};
}

Check visible_devices_check(const HostFacts& facts) {
  const auto it = facts.env.find("CUDA_VISIBLE_DEVICES");
  if (it == facts.env.end()) return {CheckStatus::kOk, "CUDA_VISIBLE_DEVICES", "unset: every GPU is visible", ""};
  const std::string& value = it->second;
  if (value.empty() || value == "-1" || value == "NoDevFiles") {
    return {facts.gpu_models.empty() ? CheckStatus::kInfo : CheckStatus::kWarning, "CUDA_VISIBLE_DEVICES",
            fmt::format("'{}' hides every GPU: jobs run on the CPU", value),
            facts.gpu_models.empty() ? "" : "unset CUDA_VISIBLE_DEVICES, or name the GPUs to use (e.g. 0,1)"};
  }
  const int count = static_cast<int>(facts.gpu_models.size());
  std::set<std::string> seen;
  for (const std::string& entry : split(value, ',')) {
    const bool uuid = entry.rfind("GPU-", 0) == 0 || entry.rfind("MIG-", 0) == 0;
    bool known = false;
    if (uuid) {
      known = std::any_of(facts.gpu_uuids.begin(), facts.gpu_uuids.end(),
                          [&](const std::string& id) { return id.rfind(entry, 0) == 0; }) ||
              entry.rfind("MIG-", 0) == 0;  // MIG instances are not in the driver's GPU list
    } else {
      char* end = nullptr;
      const long index = std::strtol(entry.c_str(), &end, 10);
      known = !entry.empty() && *end == '\0' && index >= 0 && index < count;
    }
    if (!known || !seen.insert(entry).second) {
      return {
          CheckStatus::kFailure, "CUDA_VISIBLE_DEVICES",
          fmt::format("'{}' names {} '{}', but the driver lists {} GPU(s){}", value, known ? "twice the GPU" : "no GPU",
                      entry, count, count > 0 ? fmt::format(" (0-{})", count - 1) : ""),
          "unset CUDA_VISIBLE_DEVICES, or list GPUs that exist, each once (indices or GPU-UUIDs, nvidia-smi -L)"};
    }
  }
  return {CheckStatus::kOk, "CUDA_VISIBLE_DEVICES", fmt::format("'{}'", value), ""};
}

Check shm_check(const HostFacts& facts) {
  const bool several_gpus = facts.gpu_models.size() > 1;
  if (facts.shm_bytes < 0) {
    return {several_gpus ? CheckStatus::kFailure : CheckStatus::kWarning, "/dev/shm", "not mounted",
            "mount a tmpfs on /dev/shm (in a container: docker run --ipc=host, or --shm-size=8g)"};
  }
  const std::string detail = fmt::format("{} ({} free)", size_text(facts.shm_bytes), size_text(facts.shm_free_bytes));
  const std::string fix =
      "give the container more shared memory: docker run --ipc=host (or --shm-size=8g); Kubernetes: an emptyDir "
      "with medium Memory mounted on /dev/shm";
  // NCCL's shared-memory transport and its proxies map buffers there for
  // every pair of local ranks; Docker's default of 64 MiB makes
  // multi-GPU jobs die with "unhandled system error" or a bus error.
  if (several_gpus && facts.shm_free_bytes < 256 * kMiB) {
    return {CheckStatus::kFailure, "/dev/shm", detail + ": too small for NCCL between local GPUs", fix};
  }
  if (several_gpus && facts.shm_bytes < 1024 * kMiB) {
    return {CheckStatus::kWarning, "/dev/shm", detail + ": NCCL may run short with many ranks or channels", fix};
  }
  return {CheckStatus::kOk, "/dev/shm", detail, ""};
}

/// NCCL_SOCKET_IFNAME: prefixes, "=name" exact, a leading "^" excludes.
Check socket_interface_check(const HostFacts& facts, const std::string& variable) {
  const auto it = facts.env.find(variable);
  if (it == facts.env.end()) return {CheckStatus::kOk, variable, "unset: chosen automatically", ""};
  std::string value = it->second;
  const bool exclude = !value.empty() && value[0] == '^';
  if (exclude) value = value.substr(1);
  std::vector<std::string> matched;
  for (const std::string& interface : facts.interfaces) {
    bool hit = false;
    for (const std::string& raw : split(value, ',')) {
      const bool exact = !raw.empty() && raw[0] == '=';
      const std::string name = exact ? raw.substr(1) : raw;
      const bool gloo = variable == "GLOO_SOCKET_IFNAME";  // Gloo takes whole names only
      hit = hit || (!name.empty() && ((exact || gloo) ? interface == name : interface.rfind(name, 0) == 0));
    }
    if (hit != exclude) matched.push_back(interface);
  }
  if (matched.empty()) {
    return {
        CheckStatus::kFailure, variable,
        fmt::format("'{}' matches no network interface of this host (it has: {})", it->second, join(facts.interfaces)),
        fmt::format("set {} to one of those interfaces (the one the other nodes reach), or unset it", variable)};
  }
  return {CheckStatus::kOk, variable, fmt::format("'{}': {}", it->second, join(matched)), ""};
}

Check infiniband_check(const HostFacts& facts) {
  const std::string hca = env_or(facts, "NCCL_IB_HCA");
  if (env_or(facts, "NCCL_IB_DISABLE") == "1") {
    return {CheckStatus::kInfo, "InfiniBand", "NCCL_IB_DISABLE=1: NCCL uses TCP sockets between nodes", ""};
  }
  if (facts.ib_devices.empty()) {
    if (!hca.empty()) {
      return {CheckStatus::kFailure, "InfiniBand",
              fmt::format("NCCL_IB_HCA='{}' but this host has no InfiniBand/RoCE device", hca),
              "unset NCCL_IB_HCA (or load the RDMA drivers: ibv_devices must list the adapters)"};
    }
    return {CheckStatus::kInfo, "InfiniBand",
            "no InfiniBand/RoCE device: between nodes NCCL uses TCP sockets (slower; fine on one node)", ""};
  }
  return {CheckStatus::kOk, "InfiniBand", join(facts.ib_devices), ""};
}

Check hostname_check(const HostFacts& facts) {
  if (facts.hostname_resolves) return {CheckStatus::kOk, "host name", facts.hostname + " resolves", ""};
  // Gloo picks its address from the host name unless told the interface.
  const bool told = !env_or(facts, "GLOO_SOCKET_IFNAME").empty();
  return {told ? CheckStatus::kWarning : CheckStatus::kFailure, "host name",
          fmt::format("'{}' does not resolve to an address", facts.hostname),
          "add it to /etc/hosts (e.g. 127.0.1.1 " + facts.hostname + "), or set GLOO_SOCKET_IFNAME"};
}

std::vector<Check> environment_checks(const HostFacts& facts) {
  std::vector<Check> checks;
  std::vector<std::string> set;
  for (const auto& [name, value] : facts.env) {
    if (steers_the_job(name) && name != "DDP_RDZV_TOKEN") set.push_back(name + "=" + value);
  }
  checks.push_back({CheckStatus::kInfo, "variables in effect", join(set), ""});
  const auto slow = [&](const std::string& name, const std::string& bad, const std::string& why) {
    if (env_or(facts, name) == bad) {
      checks.push_back({CheckStatus::kWarning, name, name + "=" + bad + ": " + why, "unset " + name});
    }
  };
  slow("NCCL_P2P_DISABLE", "1", "GPUs exchange data through host memory, not NVLink/PCIe peer access");
  slow("NCCL_SHM_DISABLE", "1", "local ranks without peer access go through the network stack");
  slow("CUDA_LAUNCH_BLOCKING", "1", "every kernel launch waits for the GPU (a debugging setting)");
  slow("NCCL_BLOCKING_WAIT", "1", "collectives are waited for on the host");
  if (facts.gpu_models.size() > 1 && env_or(facts, "NCCL_NVLS_ENABLE").empty()) {
    checks.push_back({CheckStatus::kInfo, "NCCL_NVLS_ENABLE",
                      "unset: NCCL uses NVLink SHARP (multicast) where the NVSwitches offer it; where the fabric "
                      "manager or IMEX service is missing, communicator set-up can hang",
                      ""});
  }
  return checks;
}

}  // namespace

const char* to_string(CheckStatus status) {
  switch (status) {
    case CheckStatus::kOk: return "ok";
    case CheckStatus::kInfo: return "info";
    case CheckStatus::kWarning: return "warning";
    case CheckStatus::kFailure: return "failure";
  }
  return "?";
}

bool steers_the_job(const std::string& variable) {
  for (const char* prefix : {"NCCL_", "TORCH_NCCL_", "NVSHMEM_", "GLOO_", "DDP_", "CUDA_", "PYTORCH_CUDA_ALLOC",
                             "MASTER_", "TORCH_DISTRIBUTED", "OMP_NUM_THREADS"}) {
    if (variable.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

std::string driver_version_of(const std::string& line) {
  // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  ..." or
  // "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  ...":
  // the first word after "Module" that starts with a digit.
  const auto module = line.find("Module");
  if (module == std::string::npos) return "";
  std::stringstream words(line.substr(module));
  for (std::string word; words >> word;) {
    if (std::isdigit(static_cast<unsigned char>(word[0]))) return word;
  }
  return "";
}

HostFacts read_host_facts() {
  HostFacts facts;
  for (const std::string& gpu : entries_of("/proc/driver/nvidia/gpus")) {
    const std::string info = "/proc/driver/nvidia/gpus/" + gpu + "/information";
    facts.gpu_models.push_back(field_of(info, "Model"));
    facts.gpu_uuids.push_back(field_of(info, "GPU UUID"));
  }
  facts.driver_version = driver_version_of(read_first_line("/proc/driver/nvidia/version"));
  struct statvfs shm {};
  if (::statvfs("/dev/shm", &shm) == 0) {
    facts.shm_bytes = static_cast<std::int64_t>(shm.f_blocks) * static_cast<std::int64_t>(shm.f_frsize);
    facts.shm_free_bytes = static_cast<std::int64_t>(shm.f_bavail) * static_cast<std::int64_t>(shm.f_frsize);
  }
  facts.interfaces = entries_of("/sys/class/net");
  facts.ib_devices = entries_of("/sys/class/infiniband");
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  facts.hostname = name;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  facts.hostname_resolves = ::getaddrinfo(name, nullptr, &hints, &found) == 0;
  if (found != nullptr) ::freeaddrinfo(found);
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const auto equals = text.find('=');
    if (equals != std::string::npos) facts.env[text.substr(0, equals)] = text.substr(equals + 1);
  }
  return facts;
}

std::vector<Check> host_checks(const HostFacts& facts) {
  std::vector<Check> checks{gpus_check(facts), visible_devices_check(facts), shm_check(facts), hostname_check(facts)};
  for (const char* variable : {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}) {
    if (facts.env.count(variable) != 0) checks.push_back(socket_interface_check(facts, variable));
  }
  checks.push_back(infiniband_check(facts));
  for (Check& check : environment_checks(facts)) checks.push_back(std::move(check));
  return checks;
}

}  // namespace ddp::launcher
