#pragma once

#include <chrono>
#include <memory>
#include <optional>

#include <torch/arg.h>

#include <ddp/export.h>
#include <ddp/communicator.h>
#include <ddp/environment.h>

namespace ddp {

/// How init() joins the job. Chained setters, as in the LibTorch frontend:
///   ddp::init(ddp::InitOptions().backend(ddp::Backend::kGloo).timeout(std::chrono::seconds(60)));
struct InitOptions {
  /// Unset: the DDP_BACKEND variable ("nccl"/"gloo"), else NCCL when a GPU is
  /// visible and libddp has NCCL, else Gloo.
  TORCH_ARG(std::optional<Backend>, backend) = std::nullopt;
  /// Deadline of every collective. Unset: DDP_TIMEOUT seconds (ddprun
  /// --timeout sets it), else 10 minutes.
  TORCH_ARG(std::optional<std::chrono::milliseconds>, timeout) = std::nullopt;
  /// How long rank 0 waits for the others to connect, and they for rank 0.
  /// Unset: DDP_RDZV_TIMEOUT seconds (ddprun --rdzv-timeout sets it), else 5 minutes.
  TORCH_ARG(std::optional<std::chrono::milliseconds>, rendezvous_timeout) = std::nullopt;
  /// NCCL on one node: all-reduces and reduce-scatters of at least 512 KiB of
  /// fp32, bf16 or fp16 (DDP's gradient buckets, the sharded modes' gradient
  /// shards) move between the GPUs on the copy engines, with a short kernel
  /// adding what arrived, and all-gathers of at least 512 KiB (the sharded
  /// modes' parameters) are copies alone, instead of NCCL's kernels, which
  /// occupy SMs the backward pass computes on for the whole collective. Needs
  /// every rank on one node and peer access between their GPUs (UsageError
  /// otherwise). Works inside a captured step (ddp::CapturedStep) too. Costs
  /// 16 MiB of GPU memory per rank of the job on each GPU, outside the caching
  /// allocator.
  /// Unset: DDP_COPY_ENGINE_REDUCTIONS (1 or 0), else off.
  TORCH_ARG(std::optional<bool>, copy_engine_reductions) = std::nullopt;
  /// Debugging a hang or wrong values across ranks: before each collective the
  /// ranks all-gather what each is about to issue (operation, dtype, element
  /// count, root or reduction) and, where they differ, every rank throws a
  /// CollectiveError listing them, instead of a hang or, where the sizes
  /// differ, silently wrong data (PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL).
  /// Two tensors of one size and dtype issued in another order look alike.
  /// One extra small collective and a host synchronisation per collective, so
  /// for debugging only; collectives recorded into a CUDA graph are checked
  /// when the eager warm-up steps run them, not in the replays.
  /// Unset: DDP_CHECK_COLLECTIVES (1 or 0), else off.
  TORCH_ARG(std::optional<bool>, check_collectives) = std::nullopt;
};

/// Membership of this process in a job: its coordinates, its device and the
/// communicator that reaches every rank.
class DDP_API ProcessGroup {
 public:
  struct State;
  /// Made by init(); programs do not construct one themselves.
  explicit ProcessGroup(std::shared_ptr<State> state);
  ~ProcessGroup();

  /// The job coordinates init() read and validated.
  const Environment& environment() const;
  /// RANK: this process's global index.
  int rank() const { return environment().rank; }
  /// WORLD_SIZE: number of processes in the job.
  int world_size() const { return environment().world_size; }
  /// LOCAL_RANK: index on this node (the GPU it uses with NCCL).
  int local_rank() const { return environment().local_rank; }
  /// The backend init() chose.
  Backend backend() const { return communicator().backend(); }
  /// cuda:LOCAL_RANK with NCCL (the process's current device), cpu with Gloo.
  c10::Device device() const { return communicator().device(); }
  /// Collectives over every rank of the job.
  Communicator& communicator() const;

 private:
  std::shared_ptr<State> state_;
};

/// Joins the job described by the environment (see Environment): validates it,
/// meets the other ranks through a TCP store at MASTER_ADDR:MASTER_PORT,
/// picks the backend, binds the process to cuda:LOCAL_RANK when it uses NCCL,
/// and returns the process group. Throws UsageError for a bad environment or
/// options, and Error when the rendezvous fails or times out.
DDP_API std::shared_ptr<ProcessGroup> init(const InitOptions& options = {});

}  // namespace ddp
