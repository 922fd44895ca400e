#include "launcher/launch_options.h"
#include "launcher/ports.h"
#include "launcher/slurm.h"

#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
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

/// The workers would only time out at rendezvous on a host name that does not resolve: say so now.
void require_resolvable(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int result = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (result != 0) {
    throw LaunchUsageError(
        fmt::format("--master-addr '{}' does not resolve on this host ({}); give the name or IP "
                    "address under which the other nodes reach node 0",
                    host, ::gai_strerror(result)));
  }
  ::freeaddrinfo(found);
}

/// A file that exec can run: executable, and not a directory (which access() also lets through).
bool runnable(const std::string& path) {
  std::error_code error;
  return ::access(path.c_str(), X_OK) == 0 && std::filesystem::is_regular_file(path, error);
}

bool is_executable(const std::string& program) {
  if (program.find('/') != std::string::npos) return runnable(program);
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = dirs.find(':', start);
    const std::string dir = dirs.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (runnable((dir.empty() ? "." : dir) + "/" + program)) return true;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return false;
}

void require_writable_dir(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    throw LaunchUsageError(
        fmt::format("--log-dir {}: cannot create the folder ({}); give a writable folder", dir, error.message()));
  }
  // A file made and removed, not access(): root passes access() where it
  // cannot write either (a read-only filesystem, /proc).
  const std::string probe = fmt::format("{}/.ddprun-write-probe.{}", dir, ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw LaunchUsageError(
        fmt::format("--log-dir {}: cannot write in it ({}); give a folder you can write", dir, std::strerror(errno)));
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

/// `words` random 32-bit words in hex, from the kernel's generator.
std::string random_hex(int words) {
  std::random_device random;
  std::string hex;
  for (int i = 0; i < words; ++i) hex += fmt::format("{:08x}", random());
  return hex;
}

}  // namespace

std::string usage() {
  return R"(usage: ddprun [options] program [args...]

Starts one process per GPU (or N CPU processes) of a libddp or PyTorch job, with
the environment torchrun gives its workers: RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS.
If one worker fails, the others on this node are stopped and ddprun exits
non-zero, or restarts them all with --max-restarts.

options:
  --nproc-per-node N|gpu|cpu|auto  processes on this node (default auto: one per
                                   visible GPU, else 2 CPU processes)
  --nnodes N                       nodes in the job, one ddprun each (default 1)
  --node-rank I                    this node's index, 0 to N-1 (default 0);
                                   node 0 hosts the rendezvous store
  --master-addr HOST               host of node 0 (default 127.0.0.1)
  --master-port PORT               port of the rendezvous store (default 29500)
  --standalone                     single node: loopback and a free port
  --max-restarts K                 restart all local workers up to K times when
                                   one fails (default 0)
  --log-dir DIR                    write each rank's output to
                                   DIR/attempt_A/rank_R.log instead of the console
  --tee                            with --log-dir: to the console as well
  --rdzv-timeout SECONDS           how long workers wait for each other to join;
                                   passed as DDP_RDZV_TIMEOUT
  --timeout SECONDS                deadline of every collective (default 600);
                                   passed as DDP_TIMEOUT
  --rdzv-id ID                     the job's identity, passed as TORCHELASTIC_RUN_ID:
                                   a worker that reaches another job's rendezvous
                                   fails at once (default: random on one node,
                                   SLURM's job id on several)
  --help                           this text

Every rank presents the job's secret, DDP_RDZV_TOKEN, to the rendezvous store
before it is let in. On one node ddprun makes a random one unless it is set;
a job on several nodes needs the same DDP_RDZV_TOKEN exported on every node.

Under SLURM (srun, one ddprun per node) with none of --nnodes, --node-rank,
--master-addr given, they are taken from SLURM_NNODES, SLURM_NODEID and the
first host of SLURM_JOB_NODELIST. Exit code: 0 when every worker succeeded,
1 when the job failed, 2 for bad options, 128+N after signal N.
)";
}

LaunchOptions parse_launch_options(const std::vector<std::string>& args, bool& help) {
  LaunchOptions options;
  help = false;
  std::string nproc = "auto";
  bool port_given = false;
  bool addr_given = false;
  bool node_options_given = false;  // any of --nnodes, --node-rank, --master-addr
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
    if (has_inline_value && (flag == "--help" || flag == "--standalone" || flag == "--tee")) {
      // A switch: "--tee=false" must not turn it on.
      throw LaunchUsageError(fmt::format("{} takes no value (got '{}'); give {} alone to turn it on", flag,
                                         args[i], flag));
    }
    if (flag == "--help" || flag == "-h") {
      help = true;
      return options;
    } else if (flag == "--nproc-per-node") {
      nproc = value();
    } else if (flag == "--nnodes") {
      options.nnodes = parse_int("--nnodes", value(), 1, 1 << 20);
      node_options_given = true;
    } else if (flag == "--node-rank") {
      options.node_rank = parse_int("--node-rank", value(), 0, 1 << 20);
      node_options_given = true;
    } else if (flag == "--master-addr") {
      options.master_addr = value();
      if (options.master_addr.empty()) throw LaunchUsageError("--master-addr is empty; give the host of node 0");
      node_options_given = true;
      addr_given = true;
    } else if (flag == "--master-port") {
      options.master_port = parse_int("--master-port", value(), 1, 65535);
      port_given = true;
    } else if (flag == "--standalone") {
      options.standalone = true;
    } else if (flag == "--max-restarts") {
      options.max_restarts = parse_int("--max-restarts", value(), 0, 1000000);
    } else if (flag == "--log-dir") {
      options.log_dir = value();
      if (options.log_dir.empty()) throw LaunchUsageError("--log-dir is empty; give a folder");
    } else if (flag == "--tee") {
      options.tee = true;
    } else if (flag == "--rdzv-timeout") {
      options.rdzv_timeout_s = parse_int("--rdzv-timeout", value(), 1, 1 << 24);
    } else if (flag == "--timeout") {
      options.timeout_s = parse_int("--timeout", value(), 1, 1 << 24);
    } else if (flag == "--rdzv-id") {
      options.rdzv_id = value();
      if (options.rdzv_id.empty()) throw LaunchUsageError("--rdzv-id is empty; give the job a name");
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
  if (options.tee && options.log_dir.empty()) {
    throw LaunchUsageError("--tee copies the --log-dir files to the console; give --log-dir too");
  }

  if (options.standalone) {
    if (port_given) throw LaunchUsageError("--standalone picks its own port; drop --master-port");
    if (addr_given) throw LaunchUsageError("--standalone serves the rendezvous on loopback; drop --master-addr");
    if (options.nnodes > 1) {
      throw LaunchUsageError(fmt::format("--standalone runs on one node, but --nnodes is {}; drop --standalone and "
                                         "give --master-addr and --master-port",
                                         options.nnodes));
    }
    options.master_addr = "127.0.0.1";
    options.master_port = 0;  // each attempt reserves its own (ReservedPort)
  } else if (!node_options_given) {
    // srun starts one ddprun per node with no node options: SLURM knows them.
    const auto slurm = slurm_placement([](const std::string& name) -> std::optional<std::string> {
      const char* value = std::getenv(name.c_str());
      if (value == nullptr) return std::nullopt;
      return std::string(value);
    });
    if (slurm) {
      options.nnodes = slurm->nnodes;
      options.node_rank = slurm->node_rank;
      options.master_addr = slurm->master_addr;
      options.slurm_job_id = slurm->job_id;
    }
  }
  if (options.node_rank >= options.nnodes) {
    throw LaunchUsageError(fmt::format("--node-rank {} must be smaller than --nnodes {} (node ranks count from 0)",
                                       options.node_rank, options.nnodes));
  }
  if (options.nnodes > 1 && !addr_given && options.slurm_job_id.empty()) {
    throw LaunchUsageError(
        fmt::format("--nnodes {} needs --master-addr: the host of node 0 as the other nodes reach "
                    "it (the default, 127.0.0.1, is each machine's own loopback)",
                    options.nnodes));
  }
  if (options.rdzv_id.empty()) {
    // One node: a fresh identity per job. Several: every node's ddprun must
    // name the same one, which only SLURM (or --rdzv-id) can give them.
    if (options.nnodes == 1) {
      options.rdzv_id = random_hex(2);
    } else if (!options.slurm_job_id.empty()) {
      options.rdzv_id = "slurm-" + options.slurm_job_id;
    }
  }
  // SLURM's own node names resolve inside its allocation; a name given here is checked.
  if (!options.standalone && options.slurm_job_id.empty()) require_resolvable(options.master_addr);
  if (!options.log_dir.empty()) require_writable_dir(options.log_dir);
  if (const char* token = std::getenv("DDP_RDZV_TOKEN"); token != nullptr && *token != '\0') {
    options.rdzv_token = token;
  } else if (options.nnodes == 1) {
    options.rdzv_token = random_hex(4);
  } else {
    throw LaunchUsageError(fmt::format(
        "--nnodes {} needs DDP_RDZV_TOKEN, the secret every rank presents to the rendezvous store: export the "
        "same value on every node, e.g. DDP_RDZV_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n')",
        options.nnodes));
  }
  // Only node 0 serves the rendezvous store; elsewhere the port is remote.
  if (!options.standalone && options.node_rank == 0) require_port_free(options.master_port);
  return options;
}

int visible_gpu_count(const char* visible, int host_gpus) {
  if (host_gpus == 0) return 0;
  if (visible == nullptr) return std::max(host_gpus, 0);
  const std::string list = visible;
  if (list.empty() || list == "-1" || list == "NoDevFiles") return 0;
  const int listed = static_cast<int>(std::count(list.begin(), list.end(), ',')) + 1;
  // MIG instances are not in /proc/driver/nvidia/gpus: several can share one GPU.
  const bool mig = list.find("MIG-") != std::string::npos;
  return host_gpus < 0 || mig ? listed : std::min(listed, host_gpus);
}

int visible_gpu_count() {
  std::error_code error;
  int host_gpus = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", error)) {
    (void)entry;
    ++host_gpus;
  }
  // WSL2's driver has no /proc entry: its GPUs are behind /dev/dxg.
  if (error && std::filesystem::exists("/dev/dxg", error)) host_gpus = -1;
  return visible_gpu_count(std::getenv("CUDA_VISIBLE_DEVICES"), host_gpus);
}

}  // namespace ddp::launcher
