#include "launcher/slurm.h"

#include <cerrno>
#include <cstdlib>
#include <utility>

#include <fmt/format.h>

#include "launcher/launch_options.h"

namespace ddp::launcher {
namespace {

/// The value of `preferred`, else of `fallback`, with the name it came from.
std::pair<std::string, std::string> require(const EnvLookup& lookup, const std::string& preferred,
                                            const std::string& fallback) {
  if (auto value = lookup(preferred)) return {preferred, *value};
  if (auto value = lookup(fallback)) return {fallback, *value};
  throw LaunchUsageError(fmt::format("SLURM_JOB_ID is set but neither {} nor {} is; run ddprun through srun, or "
                                     "give --nnodes, --node-rank and --master-addr yourself",
                                     preferred, fallback));
}

int slurm_int(const std::string& name, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || value < 0 || value > 1 << 20) {
    throw LaunchUsageError(fmt::format("{}='{}' is not a node count or index", name, text));
  }
  return static_cast<int>(value);
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  // The first host is the first comma-separated item outside brackets, with
  // each bracket group replaced by its first number (zero padding kept).
  std::string host;
  size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    if (nodelist[i] != '[') {
      host += nodelist[i++];
      continue;
    }
    const size_t close = nodelist.find(']', i);
    if (close == std::string::npos) {
      throw LaunchUsageError(fmt::format("SLURM node list '{}' has an unclosed '['", nodelist));
    }
    const std::string ranges = nodelist.substr(i + 1, close - i - 1);
    const std::string first = ranges.substr(0, ranges.find_first_of(",-"));
    if (first.empty()) throw LaunchUsageError(fmt::format("SLURM node list '{}' has an empty range", nodelist));
    host += first;
    i = close + 1;
  }
  if (host.empty()) throw LaunchUsageError(fmt::format("SLURM node list '{}' names no host", nodelist));
  return host;
}

std::optional<SlurmPlacement> slurm_placement(const EnvLookup& lookup) {
  const auto job_id = lookup("SLURM_JOB_ID");
  if (!job_id) return std::nullopt;
  SlurmPlacement placement;
  placement.job_id = *job_id;
  const auto [nnodes_name, nnodes] = require(lookup, "SLURM_STEP_NUM_NODES", "SLURM_NNODES");
  placement.nnodes = slurm_int(nnodes_name, nnodes);
  if (placement.nnodes < 1) throw LaunchUsageError(fmt::format("{}=0: SLURM reports no nodes", nnodes_name));
  const auto node_id = lookup("SLURM_NODEID");
  if (!node_id) {
    throw LaunchUsageError(
        "SLURM_JOB_ID is set but SLURM_NODEID is not: start one ddprun per node with srun "
        "(srun --ntasks-per-node=1 ddprun ...), or give --nnodes, --node-rank and --master-addr yourself");
  }
  placement.node_rank = slurm_int("SLURM_NODEID", *node_id);
  if (placement.node_rank >= placement.nnodes) {
    throw LaunchUsageError(fmt::format("SLURM_NODEID={} is not below the node count {}", placement.node_rank,
                                       placement.nnodes));
  }
  placement.master_addr = first_slurm_host(require(lookup, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST").second);
  return placement;
}

}  // namespace ddp::launcher
