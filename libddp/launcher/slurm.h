#pragma once

#include <functional>
#include <optional>
#include <string>

namespace ddp::launcher {

/// This node's place in a SLURM job step, as srun describes it.
struct SlurmPlacement {
  std::string job_id;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;  ///< First host of the step's node list.
};

/// Reads a variable; nullopt when it is unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

/// The placement SLURM gives this node, or nullopt outside SLURM (no
/// SLURM_JOB_ID). Prefers the step's variables (srun -N2 inside a larger
/// allocation) over the job's. Throws LaunchUsageError when a variable is
/// missing or malformed, naming it.
std::optional<SlurmPlacement> slurm_placement(const EnvLookup& lookup);

/// First host of a SLURM node list such as "node[01-04,07],gpu3" (node01),
/// expanded without scontrol, which compute nodes need not have.
std::string first_slurm_host(const std::string& nodelist);

}  // namespace ddp::launcher
