#pragma once

// ddprun --doctor's checks of the machine a job runs on, made without
// LibTorch or CUDA: what the NVIDIA driver, /dev/shm, the network and the
// environment say. The checks that need the libraries (versions, peer
// access, an all-reduce) run in the worker probe (libddp/doctor/).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ddp::launcher {

enum class CheckStatus { kOk, kInfo, kWarning, kFailure };

/// One finding: what was checked, what was seen and, unless it is fine, how
/// to fix it. A failure is something that would stop a job.
struct Check {
  CheckStatus status = CheckStatus::kInfo;
  std::string name;
  std::string detail;
  std::string fix;
};

/// What the checks look at, gathered by read_host_facts() (tests build their own).
struct HostFacts {
  std::vector<std::string> gpu_models;  ///< One per GPU the driver lists.
  std::vector<std::string> gpu_uuids;   ///< In the same order.
  std::string driver_version;           ///< Empty without the NVIDIA driver.
  std::int64_t shm_bytes = -1;          ///< Size of /dev/shm; -1: not mounted.
  std::int64_t shm_free_bytes = -1;
  std::vector<std::string> interfaces;  ///< Network interfaces (/sys/class/net).
  std::vector<std::string> ib_devices;  ///< InfiniBand/RoCE devices (/sys/class/infiniband).
  std::string hostname;
  bool hostname_resolves = true;
  std::map<std::string, std::string> env;  ///< The variables set.
};

HostFacts read_host_facts();

/// The driver's version in the first line of /proc/driver/nvidia/version; empty if none.
std::string driver_version_of(const std::string& line);

/// Every host check, in report order.
std::vector<Check> host_checks(const HostFacts& facts);

/// The environment variables that steer NCCL, Gloo, CUDA and libddp.
bool steers_the_job(const std::string& variable);

const char* to_string(CheckStatus status);

}  // namespace ddp::launcher
