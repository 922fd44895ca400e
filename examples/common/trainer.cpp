#include "trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <ddp/captured_step.h>
#include <ddp/errors.h>

#include "lr_schedule.h"
#include "progress.h"
#include "training_checkpoint.h"

namespace examples {

void add_trainer_flags(Flags& flags, double default_lr, std::int64_t default_steps, std::int64_t default_warmup,
                       const std::string& default_cuda_graph) {
  flags.add("steps", std::to_string(default_steps), "optimizer steps of the run")
      .add("lr", fmt::format("{}", default_lr), "peak learning rate, reached after the warmup")
      .add("min-lr", "0", "learning rate at the end of the cosine decay")
      .add("warmup", std::to_string(default_warmup), "steps of linear warmup")
      .add("grad-accum", "1", "micro-batches per optimizer step (no_sync for all but the last)")
      .add("clip-grad-norm", "0", "clip the gradient norm to this (0: off)")
      .add("log-every", "10", "steps between progress lines (each costs a device synchronisation)")
      .add("checkpoint", "",
           "checkpoint file (written by rank 0, atomically), or directory with --checkpoint-format sharded")
      .add("checkpoint-format", "whole",
           "whole: one file, gathered to rank 0; sharded: a file per rank, written in parallel, and a manifest")
      .add("checkpoint-every", "0", "steps between checkpoints (0: only at the end)")
      .add_switch("resume", "continue from --checkpoint if it exists")
      .add("eval-every", "0", "steps between evaluations (0: only at the end)")
      .add("metrics", "", "JSON-lines metrics log (rank 0)")
      .add("fail-at-step", "-1", "testing restarts: the last rank aborts after this step on the first attempt")
      .add("uneven", "drop",
           "an epoch's windows or images left over after the last step every rank takes: drop them, or join: deal "
           "them out as one more step to as many ranks as they fill, the others meeting its collectives "
           "(ddp::Join, eager steps)")
      .add("cuda-graph", default_cuda_graph,
           "on: record the whole step (micro-batches, clipping, loss scaling, optimizer) into a CUDA graph after at "
           "least 3 eager steps and replay it, one launch per step (GPU only); off: eager steps; auto: on with a "
           "CUDA device unless --uneven join");
}

void require_same_flags_on_every_rank(const Flags& flags, ddp::ProcessGroup& process_group) {
  // Paths may differ between hosts; what they decide may not: whether there is a checkpoint (its save and
  // load are collective), synthetic data or files, a separate validation set.
  const auto compared = [&flags](const std::string& name) -> std::string {
    const std::string& value = flags.str(name);
    if (name == "workers" || name == "metrics") return "";
    if (name == "data") return value == "synthetic" ? value : "files";
    if (name == "val-data" || name == "checkpoint") return value.empty() ? "none" : "given";
    return value;
  };
  std::vector<std::string> names;
  std::vector<std::int64_t> hashes;
  for (const std::string& name : flags.names()) {
    names.push_back(name);
    hashes.push_back(static_cast<std::int64_t>(std::hash<std::string>{}(compared(name)) >> 1));
  }
  const auto count = static_cast<std::int64_t>(hashes.size());
  const int world = process_group.world_size();
  at::Tensor all = at::empty({world * count}, at::TensorOptions().dtype(at::kLong).device(process_group.device()));
  process_group.communicator().all_gather(all, at::tensor(hashes, at::kLong).to(process_group.device()))->wait();
  all = all.cpu().view({world, count});
  for (std::int64_t f = 0; f < count; ++f) {
    std::vector<int> differ;
    for (int rank = 1; rank < world; ++rank) {
      if (all[rank][f].item<std::int64_t>() != all[0][f].item<std::int64_t>()) differ.push_back(rank);
    }
    if (differ.empty()) continue;
    const std::string& name = names[static_cast<std::size_t>(f)];
    throw ddp::UsageError(fmt::format(
        "--{} differs between ranks: rank(s) {} were given another value than rank 0 (this is rank {}, with '{}'); "
        "give every rank the same flags (paths may differ, but not whether they are given)",
        name, fmt::join(differ, ", "), process_group.rank(), flags.str(name)));
  }
}

TrainerOptions trainer_options(const Flags& flags) {
  TrainerOptions options;
  options.steps = flags.integer("steps");
  options.peak_lr = flags.real("lr");
  options.min_lr = flags.real("min-lr");
  options.warmup_steps = flags.integer("warmup");
  options.grad_accum = flags.integer("grad-accum");
  options.clip_grad_norm = flags.real("clip-grad-norm");
  const std::string cuda_graph = flags.str("cuda-graph");
  if (cuda_graph == "on") {
    options.cuda_graph = TrainerOptions::CudaGraph::kOn;
  } else if (cuda_graph == "off") {
    options.cuda_graph = TrainerOptions::CudaGraph::kOff;
  } else if (cuda_graph == "auto") {
    options.cuda_graph = TrainerOptions::CudaGraph::kAuto;
  } else {
    flags.fail(fmt::format("--cuda-graph must be on, off or auto, got '{}'", cuda_graph));
  }
  const std::string uneven = flags.str("uneven");
  if (uneven != "drop" && uneven != "join") flags.fail(fmt::format("--uneven must be drop or join, got '{}'", uneven));
  options.uneven_join = uneven == "join";
  if (options.uneven_join && options.cuda_graph == TrainerOptions::CudaGraph::kOn) {
    flags.fail(
        "--uneven join trains the uneven steps eagerly under ddp::Join; use --cuda-graph off or auto, or --uneven "
        "drop");
  }
  options.log_every = flags.integer("log-every");
  options.checkpoint = flags.str("checkpoint");
  options.checkpoint_every = flags.integer("checkpoint-every");
  const std::string format = flags.str("checkpoint-format");
  if (format != "whole" && format != "sharded") {
    flags.fail(fmt::format("unknown --checkpoint-format '{}'; choose whole or sharded", format));
  }
  options.checkpoint_format = format == "sharded" ? CheckpointFormat::kSharded : CheckpointFormat::kWhole;
  options.resume = flags.on("resume");
  options.eval_every = flags.integer("eval-every");
  options.metrics = flags.str("metrics");
  options.fail_at_step = flags.integer("fail-at-step");
  if (options.steps < 1) flags.fail("--steps must be at least 1");
  if (!(options.peak_lr > 0) || !std::isfinite(options.peak_lr)) {
    flags.fail(fmt::format("--lr must be a finite number > 0, got {}", flags.str("lr")));
  }
  if (!(options.min_lr >= 0) || !std::isfinite(options.min_lr) || options.min_lr > options.peak_lr) {
    flags.fail(fmt::format("--min-lr must be a finite number from 0 to --lr ({}), got {}", flags.str("lr"),
                           flags.str("min-lr")));
  }
  if (options.clip_grad_norm < 0 || !std::isfinite(options.clip_grad_norm)) {
    flags.fail(fmt::format("--clip-grad-norm must be a finite number >= 0, got {}", flags.str("clip-grad-norm")));
  }
  if (options.grad_accum < 1) flags.fail("--grad-accum must be at least 1");
  if (options.log_every < 1) flags.fail("--log-every must be at least 1");
  if (options.warmup_steps < 0 || options.checkpoint_every < 0 || options.eval_every < 0) {
    flags.fail("--warmup, --checkpoint-every and --eval-every must not be negative");
  }
  if (options.resume && options.checkpoint.empty()) flags.fail("--resume needs --checkpoint");
  // What the LR schedule and the clipping take from the flags: a resume must
  // continue the same run (--steps may grow: training goes on longer).
  options.fingerprint = fmt::format("lr={} min_lr={} warmup={} clip={}", options.peak_lr, options.min_lr,
                                    options.warmup_steps, options.clip_grad_norm);
  return options;
}

Trainer::Trainer(std::shared_ptr<ddp::ProcessGroup> process_group, const ddp::PrecisionPolicy& policy,
                 torch::optim::Optimizer& optimizer, TrainerOptions options)
    : process_group_(std::move(process_group)),
      policy_(policy),
      optimizer_(optimizer),
      options_(std::move(options)),
      captured_(options_.cuda_graph == TrainerOptions::CudaGraph::kOn ||
                (options_.cuda_graph == TrainerOptions::CudaGraph::kAuto && process_group_->device().is_cuda() &&
                 !options_.uneven_join)),
      scaler_(ddp::GradScaler::for_policy(policy, process_group_)) {
  if (captured_ && !process_group_->device().is_cuda()) {
    throw ddp::UsageError(
        "--cuda-graph on records the step into a CUDA graph, which needs a CUDA device; use --cuda-graph off or auto "
        "on the CPU");
  }
}

namespace {

/// A recorded step zeroes its gradients in place: every replay must write
/// the same tensors (zero_grad() frees them in LibTorch 2).
void zero_gradients_in_place(torch::optim::Optimizer& optimizer) {
  for (auto& group : optimizer.param_groups()) {
    for (auto& parameter : group.params()) {
      if (parameter.grad().defined()) parameter.mutable_grad().zero_();
    }
  }
}

}  // namespace

void Trainer::save(const TrainingCallbacks& callbacks, std::int64_t step) {
  TrainingState state;
  state.step = step;
  state.data_position = callbacks.data_position();
  state.fingerprint = options_.fingerprint;
  save_training_checkpoint(*process_group_, options_.checkpoint, options_.checkpoint_format,
                           callbacks.model_checkpointing, scaler_, state);
}

double Trainer::run(const TrainingCallbacks& callbacks) {
  const int rank = process_group_->rank();
  const c10::Device device = process_group_->device();
  const bool resuming = options_.resume && checkpoint_exists(options_.checkpoint, options_.checkpoint_format);
  if (options_.resume) {
    // Every rank reads the checkpoint itself: ranks that disagree on whether there is one run different collectives.
    at::Tensor seeing = at::full({1}, resuming ? 1 : 0, at::TensorOptions().dtype(at::kLong).device(device));
    process_group_->communicator().all_reduce(seeing, ddp::ReduceOp::kSum)->wait();
    const std::int64_t ranks = seeing.cpu().item<std::int64_t>();
    if (ranks != 0 && ranks != process_group_->world_size()) {
      throw ddp::UsageError(fmt::format(
          "--resume: the checkpoint {} exists for {} of {} ranks (rank {} {} it); every rank must see the same "
          "checkpoint (a shared filesystem), or none to start afresh",
          options_.checkpoint, ranks, process_group_->world_size(), rank, resuming ? "sees" : "does not see"));
    }
  }
  if (!options_.checkpoint.empty()) {
    check_checkpoint_writable(*process_group_, options_.checkpoint, options_.checkpoint_format);
  }
  Progress progress(rank, options_.steps, options_.unit, options_.metrics, resuming, device);
  ddp::set_process_tf32(policy_);  // the guard covers forward only; backward needs the same math mode

  std::int64_t step = 0;
  if (resuming) {
    TrainingState state;
    state.fingerprint = options_.fingerprint;
    const auto start = std::chrono::steady_clock::now();
    load_training_checkpoint(*process_group_, options_.checkpoint, options_.checkpoint_format,
                             callbacks.model_checkpointing, scaler_, state);
    callbacks.seek_data(state.data_position);
    step = state.step;
    progress.note(fmt::format("resumed from {} at step {} (loaded in {:.2f} s)", options_.checkpoint, step,
                              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()));
    progress.event("resume", fmt::format("\"step\": {}", step));
  }

  const char* restart_count = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const bool first_attempt = restart_count == nullptr || std::string(restart_count) == "0";
  const double loss_weight = 1.0 / static_cast<double>(options_.grad_accum);
  const double items_per_step = options_.items_per_micro_batch * static_cast<double>(options_.grad_accum) *
                                process_group_->world_size();
  auto window_start = std::chrono::steady_clock::now();
  std::int64_t window_steps = 0;
  double last_loss = 0;

  const auto evaluate = [&](std::int64_t at_step) {
    if (!callbacks.evaluate) return;
    const auto [line, json] = callbacks.evaluate();
    progress.note(fmt::format("step {}: {}", at_step, line));
    progress.event("eval", fmt::format("\"step\": {}, {}", at_step, json));
  };

  // After the last micro-batch's backward: clipping, then the step.
  const auto apply_gradients = [&] {
    if (options_.clip_grad_norm > 0) {
      scaler_.unscale_(optimizer_);
      callbacks.clip_grad_norm(options_.clip_grad_norm);
    }
    scaler_.step(optimizer_);
    scaler_.update();
  };
  // One optimizer step over the micro-batches' tensors, laid end to end.
  const auto train_step = [&](const std::vector<at::Tensor>& inputs) {
    if (captured_) {
      zero_gradients_in_place(optimizer_);
    } else {
      optimizer_.zero_grad();
    }
    const auto per_micro_batch = static_cast<std::ptrdiff_t>(inputs.size()) / options_.grad_accum;
    at::Tensor loss;
    for (std::int64_t micro = 0; micro < options_.grad_accum; ++micro) {
      const auto first = inputs.begin() + micro * per_micro_batch;
      loss = callbacks.micro_step({first, first + per_micro_batch}, /*sync=*/micro + 1 == options_.grad_accum, scaler_,
                                  loss_weight);
    }
    apply_gradients();
    return loss;
  };
  std::optional<ddp::CapturedStep> captured;
  if (captured_) {
    captured.emplace(optimizer_, train_step, ddp::CapturedStepOptions().process_group(process_group_));
  }

  const auto draw_step = [&] {
    std::vector<at::Tensor> inputs;
    for (std::int64_t micro = 0; micro < options_.grad_accum; ++micro) {
      for (at::Tensor& tensor : callbacks.next_batch()) inputs.push_back(std::move(tensor));
    }
    return inputs;
  };
  at::Tensor loss;
  bool trained_here = true;  // whether this rank had the last step's batches
  while (step < options_.steps) {
    const double lr = warmup_cosine(step, options_.warmup_steps, options_.steps, options_.peak_lr, options_.min_lr);
    for (auto& group : optimizer_.param_groups()) group.options().set_lr(lr);
    const bool recorded_before = captured && captured->captured();
    if (callbacks.uneven_step_next && callbacks.uneven_step_next()) {
      // An epoch's uneven tail: the ranks that have its batches step; the
      // others meet their collectives and then take their model and state.
      // (With sharding a rank without batches still steps its shard, as the others step theirs.)
      std::unique_ptr<ddp::Join> join =
          callbacks.join(ddp::JoinOptions().grad_scaler(&scaler_).optimizer(&optimizer_).shadow_step(apply_gradients));
      trained_here = callbacks.has_step_here();
      if (trained_here) {
        loss = train_step(draw_step());
      } else {
        callbacks.skip_step();
      }
      join->done();
      progress.note(
          fmt::format("step {}: an epoch's uneven tail, trained by the ranks that have its data under "
                      "ddp::Join",
                      step + 1));
    } else {
      trained_here = true;
      const std::vector<at::Tensor> inputs = draw_step();
      loss = captured ? (*captured)(inputs) : train_step(inputs);
    }
    ++step;
    if (captured && !recorded_before && captured->captured()) {
      progress.note(fmt::format("step {} recorded into a CUDA graph; the later steps replay it", step));
    }
    ++window_steps;

    if (step % options_.log_every == 0 || step == options_.steps) {
      // Averaged over ranks, so that the log shows the job's loss, not rank 0's.
      // (Over the ranks that trained the step: an uneven tail's are some.)
      const auto on_device = at::TensorOptions().dtype(at::kFloat).device(device);
      at::Tensor sums = trained_here ? at::stack({loss.to(on_device).reshape({}), at::ones({}, on_device)})
                                     : at::zeros({2}, on_device);
      process_group_->communicator().all_reduce(sums)->wait();
      sums = sums.cpu();  // synchronises: the window's time is the device's
      last_loss = sums[0].item<double>() / sums[1].item<double>();
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start).count();
      StepMetrics metrics;
      metrics.step = step;
      metrics.steps = window_steps;
      metrics.loss = last_loss;
      metrics.learning_rate = lr;
      metrics.items = items_per_step * static_cast<double>(window_steps);
      metrics.seconds = seconds;
      progress.record(metrics);
      window_steps = 0;
      window_start = std::chrono::steady_clock::now();
    }
    const bool checkpoint_due = !options_.checkpoint.empty() &&
                                ((options_.checkpoint_every > 0 && step % options_.checkpoint_every == 0) ||
                                 step == options_.steps);
    if (checkpoint_due) {
      const auto start = std::chrono::steady_clock::now();
      save(callbacks, step);
      progress.note(fmt::format("checkpoint of step {} written to {} in {:.2f} s", step, options_.checkpoint,
                                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()));
    }
    if (options_.eval_every > 0 && step % options_.eval_every == 0 && step != options_.steps) evaluate(step);
    if (step == options_.fail_at_step && first_attempt && rank == process_group_->world_size() - 1) {
      std::fprintf(stderr, "rank %d: --fail-at-step %lld: aborting to test the restart\n", rank,
                   static_cast<long long>(step));
      std::abort();
    }
    // Checkpoints and evaluations right after a report stay out of the next
    // window's throughput; elsewhere they count (steps are not timed one by one).
    if (window_steps == 0) window_start = std::chrono::steady_clock::now();
  }
  evaluate(step);
  return last_loss;
}

}  // namespace examples
