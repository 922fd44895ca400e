#include "support/nccl_collective_log.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace ddp::testing {
namespace {

/// NCCL_DEBUG_FILE's pattern and the file NCCL makes of it for this process (%p: its pid).
constexpr const char* kLogPrefix = "/tmp/ddp-nccl-collectives.";

std::string log_path_pattern() { return std::string(kLogPrefix) + "%p.log"; }

std::string log_path() { return kLogPrefix + std::to_string(::getpid()) + ".log"; }

/// Bytes per element of NCCL's datatype codes (ncclInt8 = 0 ... ncclFloat8e5m2 = 11).
std::int64_t nccl_element_size(int datatype) {
  constexpr std::int64_t kSizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return datatype >= 0 && datatype < 12 ? kSizes[datatype] : 0;
}

/// The number after `key ` in an NCCL log line, or -1.
std::int64_t field(const std::string& line, const std::string& key) {
  const auto at = line.find(key);
  if (at == std::string::npos) return -1;
  std::istringstream in(line.substr(at + key.size()));
  std::int64_t value = -1;
  in >> value;
  return value;
}

}  // namespace

RunOptions nccl_logging_collectives() {
  RunOptions options;
  options.env = {{"NCCL_DEBUG", "INFO"}, {"NCCL_DEBUG_SUBSYS", "COLL"}, {"NCCL_DEBUG_FILE", log_path_pattern()}};
  return options;
}

NcclLoggedCollectives nccl_logged_collectives(std::int64_t large_bytes) {
  NcclLoggedCollectives logged;
  std::ifstream log(log_path());
  for (std::string line; std::getline(log, line);) {
    const bool all_reduce = line.find("AllReduce: opCount") != std::string::npos;
    const bool reduce_scatter = line.find("ReduceScatter: opCount") != std::string::npos;
    const bool all_gather = line.find("AllGather: opCount") != std::string::npos;
    if (!all_reduce && !reduce_scatter && !all_gather) continue;
    const bool per_rank = !all_reduce;  // counts are per rank: the whole is nranks times as big
    ++logged.count;
    const std::int64_t ranks = per_rank ? field(line, "[nranks=") : 1;
    const std::int64_t count = field(line, "count ");
    const std::int64_t element_size = nccl_element_size(static_cast<int>(field(line, "datatype ")));
    if (count < 0 || element_size == 0 || ranks < 1) {  // a format this parser does not know must not pass as small
      throw std::runtime_error("cannot read the size of a collective from NCCL's log line: " + line);
    }
    const std::int64_t bytes = count * element_size * ranks;
    if (bytes < large_bytes) continue;
    ++logged.large;
    logged.large_reduce_scatters += reduce_scatter;
    logged.large_all_gathers += all_gather;
  }
  return logged;
}

}  // namespace ddp::testing
