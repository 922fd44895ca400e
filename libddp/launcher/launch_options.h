#pragma once

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::launcher {

/// Bad command line: ddprun prints it with the usage and exits with code 2.
class LaunchUsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct LaunchOptions {
  int nproc_per_node = 0;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  ///< --standalone: 0, each attempt reserves a free one.
  bool standalone = false;
  int max_restarts = 0;
  std::string log_dir;  ///< Empty: worker output goes to the console.
  bool tee = false;     ///< With log_dir: to the console as well.
  int rdzv_timeout_s = 0;  ///< 0: leave DDP_RDZV_TIMEOUT as the environment has it.
  int timeout_s = 0;       ///< 0: leave DDP_TIMEOUT (the collectives' deadline) as the environment has it.
  /// The job's identity, TORCHELASTIC_RUN_ID of every worker (--rdzv-id).
  /// Empty: a random one on a single node; on several, SLURM's job id, else
  /// none (every node's ddprun would make a different one).
  std::string rdzv_id;
  /// The job's secret, DDP_RDZV_TOKEN of every worker: from the environment,
  /// else a random one on a single node (several nodes must share one).
  std::string rdzv_token;
  std::string slurm_job_id;  ///< Set when the node options came from SLURM.
  std::chrono::milliseconds grace_period{5000};  ///< SIGTERM to SIGKILL when tearing down.
  std::vector<std::string> command;              ///< Program and its arguments.
};

/// ddprun's usage text.
std::string usage();

/// Parses ddprun's arguments (without argv[0]) and checks that the job can
/// start: the program exists, the log folder is writable and, on node rank 0,
/// the rendezvous port is free. Throws LaunchUsageError. `help` is set when
/// --help was given (nothing else is then checked). Reads SLURM_* when no
/// node option is given.
LaunchOptions parse_launch_options(const std::vector<std::string>& args, bool& help);

/// GPUs this process may use: CUDA_VISIBLE_DEVICES when set, otherwise the
/// devices the NVIDIA driver lists. Needs no CUDA runtime.
int visible_gpu_count();
/// The same from its inputs: `visible` is CUDA_VISIBLE_DEVICES (null: unset), `host_gpus` the GPUs the driver
/// lists (-1: a driver that lists none in /proc, as WSL2's). A list never counts more GPUs than the host has,
/// but for MIG instances (MIG-...), several of which can share one GPU.
int visible_gpu_count(const char* visible, int host_gpus);

}  // namespace ddp::launcher
