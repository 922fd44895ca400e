#pragma once

// The training loop both examples share: learning-rate schedule, gradient
// accumulation, loss scaling and clipping, progress and metrics, periodic
// checkpoints and an exact resume. Each example supplies the parts that
// differ (the micro-step, the data position, the evaluation).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <ddp/grad_scaler.h>
#include <ddp/join.h>
#include <ddp/precision.h>
#include <ddp/process_group.h>

#include "flags.h"
#include "training_checkpoint.h"

namespace examples {

struct TrainerOptions {
  std::int64_t steps = 100;  ///< Optimizer steps of the whole run.
  std::int64_t warmup_steps = 10;
  double peak_lr = 0.1;
  double min_lr = 0;
  std::int64_t grad_accum = 1;  ///< Micro-batches per optimizer step.
  double clip_grad_norm = 0;    ///< 0: no clipping.
  std::int64_t log_every = 10;
  std::string checkpoint;             ///< "": no checkpoints.
  CheckpointFormat checkpoint_format = CheckpointFormat::kWhole;  ///< kSharded: `checkpoint` is a directory.
  std::int64_t checkpoint_every = 0;  ///< 0: only at the end.
  bool resume = false;                ///< Continue from `checkpoint` if it exists.
  std::int64_t eval_every = 0;        ///< 0: only at the end.
  std::string metrics;                ///< JSON-lines log; "": none.
  /// For testing restarts: the last rank aborts after this step, on the
  /// first attempt of a ddprun --max-restarts job only.
  std::int64_t fail_at_step = -1;
  std::string unit;                  ///< "img/s" or "tok/s".
  double items_per_micro_batch = 0;  ///< Images or tokens per micro-batch and rank.
  std::string fingerprint;           ///< What a checkpoint must match to be resumed.
  /// kOn records the whole step (micro-batches, clipping, loss scaling, the
  /// optimizer) into a CUDA graph after a few eager steps and replays it
  /// (ddp::CapturedStep); kAuto does so on a CUDA device unless the steps
  /// are uneven (uneven_join trains eagerly).
  enum class CudaGraph { kOff, kOn, kAuto };
  CudaGraph cuda_graph = CudaGraph::kOff;
  /// --uneven join: an epoch's leftover data makes one more step for some
  /// ranks, trained under ddp::Join (the example wires the callbacks).
  bool uneven_join = false;
};

/// Declares the flags of TrainerOptions, with the example's defaults for the
/// learning rate, the step counts and --cuda-graph (on, off or auto).
void add_trainer_flags(Flags& flags, double default_lr, std::int64_t default_steps, std::int64_t default_warmup,
                       const std::string& default_cuda_graph);
/// Throws ddp::UsageError on every rank unless every rank was given the same flags. Paths may differ between
/// hosts (--data, --val-data and --checkpoint only as to whether they are given; --metrics, and --workers, freely).
/// Ranks given another --steps or --batch ran different collectives and ended in the backend's abort. Collective;
/// call it after ddp::init().
void require_same_flags_on_every_rank(const Flags& flags, ddp::ProcessGroup& process_group);
/// Reads them back (unit and items are the example's to set; the fingerprint
/// holds the LR schedule's and clipping's flags, for the example to extend).
TrainerOptions trainer_options(const Flags& flags);

struct TrainingCallbacks {
  /// The next micro-batch's tensors, on the device: what a recorded step
  /// reads is copied into its own tensors before each replay.
  std::function<std::vector<at::Tensor>()> next_batch;
  /// Forward and backward of one micro-batch: the forward under the
  /// precision guard, then scaler.scale(loss * loss_weight).backward(); with
  /// sync false inside the DDP module's no_sync(). Returns the loss, detached.
  /// It must not read values on the host (it may be recorded into a CUDA graph).
  std::function<at::Tensor(const std::vector<at::Tensor>& batch, bool sync, ddp::GradScaler& scaler,
                           double loss_weight)>
      micro_step;
  std::function<std::vector<std::int64_t>()> data_position;
  std::function<void(const std::vector<std::int64_t>&)> seek_data;
  /// Clips the gradients the optimizer steps to a norm over the whole model
  /// (ddp::clip_grad_norm_: with sharding each rank holds only part of them).
  std::function<void(double max_norm)> clip_grad_norm;
  /// The module and the optimizer's state in checkpoints (model_checkpointing()).
  ModelCheckpointing model_checkpointing;
  /// Optional: evaluates the model and returns a line to print (rank 0) and
  /// a JSON object body for the metrics log.
  std::function<std::pair<std::string, std::string>()> evaluate;

  /// Optional (--uneven join): whether the next step is an epoch's uneven
  /// tail (the same on every rank), whether this rank has its batches, and
  /// how a rank without them moves past them.
  std::function<bool()> uneven_step_next;
  std::function<bool()> has_step_here;
  std::function<void()> skip_step;
  /// Puts the model under a ddp::Join with these options for such a step
  /// (they keep the scaler and the optimizer in step on the ranks without batches).
  std::function<std::unique_ptr<ddp::Join>(const ddp::JoinOptions&)> join;
};

/// --uneven join: the uneven-tail callbacks from a data source (TokenSource,
/// ImageSource) and the DDP model a Join wraps; both outlive the callbacks.
template <typename Source, typename Model>
void train_uneven_tails_under_join(TrainingCallbacks& callbacks, Source& source, Model& model) {
  callbacks.uneven_step_next = [&source] { return source.uneven_step_next(); };
  callbacks.has_step_here = [&source] { return source.has_step_here(); };
  callbacks.skip_step = [&source] { source.skip_step(); };
  callbacks.join = [&model](const ddp::JoinOptions& options) { return std::make_unique<ddp::Join>(model, options); };
}

class Trainer {
 public:
  Trainer(std::shared_ptr<ddp::ProcessGroup> process_group, const ddp::PrecisionPolicy& policy,
          torch::optim::Optimizer& optimizer, TrainerOptions options);

  /// Trains until options.steps, resuming first when asked. Returns the loss
  /// of the last step, averaged over ranks.
  double run(const TrainingCallbacks& callbacks);

 private:
  void save(const TrainingCallbacks& callbacks, std::int64_t step);

  std::shared_ptr<ddp::ProcessGroup> process_group_;
  ddp::PrecisionPolicy policy_;
  torch::optim::Optimizer& optimizer_;
  TrainerOptions options_;
  bool captured_;  ///< options_.cuda_graph resolved for the device.
  ddp::GradScaler scaler_;
};

}  // namespace examples
