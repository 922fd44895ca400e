#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <ddp/export.h>

namespace ddp {

/// Where this process sits in the job, read from the variables that ddprun,
/// torchrun, SLURM wrappers and Kubernetes training operators set.
struct DDP_API Environment {
  int rank = 0;              ///< RANK: global index of this process, 0 <= rank < world_size.
  int world_size = 1;        ///< WORLD_SIZE: number of processes in the job.
  int local_rank = 0;        ///< LOCAL_RANK: index on this node; picks the GPU. Default: RANK.
  int local_world_size = 1;  ///< LOCAL_WORLD_SIZE: processes on this node. Default: WORLD_SIZE.
  std::string master_addr;   ///< MASTER_ADDR: host of rank 0, which serves the rendezvous store.
  std::uint16_t master_port = 0;  ///< MASTER_PORT: port of the rendezvous store.
  /// TORCHELASTIC_RUN_ID: the job's identity (ddprun makes one per job, or
  /// takes --rdzv-id). Rendezvous refuses a rank of another job. Empty: unset.
  std::string run_id;
  /// DDP_RDZV_TOKEN: the job's shared secret, which every rank presents to
  /// rank 0's store before anything else is read. ddprun makes one for a job
  /// on one node; a job across nodes must have one. Empty: unset.
  std::string rdzv_token;

  /// Reads and validates the process environment. Throws UsageError naming
  /// the variable that is missing, not a number, or out of range.
  static Environment from_env();

  /// Same rules, reading variables through `lookup` (returns nullopt when unset).
  static Environment parse(const std::function<std::optional<std::string>(const std::string&)>& lookup);
};

}  // namespace ddp
