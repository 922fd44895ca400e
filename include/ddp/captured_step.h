#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <ddp/export.h>
#include <ddp/process_group.h>

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace ddp {

/// Options of a CapturedStep.
struct CapturedStepOptions {
  /// Eager steps before the capture. DistributedDataParallel across ranks
  /// rebuilds its buckets in its second iteration (a UsageError if that
  /// iteration is the recorded one), and the allocator, cuBLAS and cuDNN
  /// settle their workspaces in the first few; a capture records what the
  /// step does then. At least 1; 2 or more with DistributedDataParallel.
  TORCH_ARG(int, warmup_steps) = 3;
  /// The job's process group, whose communicator watches each replay as one
  /// collective (deadline, abort, the failing rank named), since the
  /// collectives recorded in the graph are never launched one by one. Null:
  /// a step without collectives.
  TORCH_ARG(std::shared_ptr<ProcessGroup>, process_group) = nullptr;
};

/// A training step recorded once into a CUDA graph and replayed: one launch
/// per step instead of the thousand kernel launches of a ResNet-50 step.
///
///   ddp::CapturedStep step(optimizer, [&](const std::vector<at::Tensor>& batch) {
///     optimizer.zero_grad(/*set_to_none=*/false);
///     at::Tensor loss = criterion(model->forward(batch[0]), batch[1]);
///     loss.backward();
///     optimizer.step();
///     return loss;
///   }, ddp::CapturedStepOptions().process_group(process_group));
///   for (auto& [x, y] : loader) at::Tensor loss = step({x, y});
///
/// The first warmup_steps calls run the function eagerly; the next records
/// it (forward, backward with DistributedDataParallel's bucket reductions,
/// the optimizer step) and replays it, and every later call copies its
/// inputs into the recorded ones and replays. The function must read its
/// tensors from its argument and do the same thing every step: no value
/// read on the host (`.item()`, a copy to the CPU), no shape that changes.
/// Gradients must be zeroed in place (set_to_none = false), so that every
/// replay writes the same tensors. The optimizer must be capturable
/// (ddp::optim::FusedAdamW, FusedSGD): a schedule that sets its learning
/// rate each step works, since the rate is copied to the device before
/// every replay.
///
/// A ddp::GradScaler works inside the step: its scale, its inf/NaN check
/// (agreed across ranks) and the skipping of a step stay on the device.
/// Accumulation over micro-batches (no_sync) belongs inside the function, so
/// that one graph records every micro-step. Warm-up lasts at least
/// warmup_steps calls, and until the optimizer has stepped every parameter
/// (a GradScaler may skip the first steps).
///
/// What cannot be recorded is a UsageError that says so: inputs off the GPU,
/// another optimizer, a step that synchronises with the host (`.item()`,
/// find_unused_parameters without static_graph), inputs of another shape or
/// dtype than the recorded ones (reset() records anew).
class DDP_API CapturedStep {
 public:
  /// The function a step runs: the batch's tensors in, a result out (the
  /// loss), which the replays overwrite.
  using Function = std::function<at::Tensor(const std::vector<at::Tensor>& inputs)>;

  /// Turns the optimizer's capturable mode on (UsageError where it has none).
  CapturedStep(torch::optim::Optimizer& optimizer, Function function, CapturedStepOptions options = {});
  ~CapturedStep();
  CapturedStep(const CapturedStep&) = delete;
  CapturedStep& operator=(const CapturedStep&) = delete;

  /// One step on `inputs` (CUDA tensors, as many, shaped and typed as in
  /// every call since the last reset()). Returns the function's result,
  /// detached from its autograd graph; after the capture it is the recorded
  /// result tensor, which the next call overwrites: clone it to keep it.
  at::Tensor operator()(const std::vector<at::Tensor>& inputs);

  /// Drops the recorded graph (and the memory it holds): the next calls warm
  /// up and record anew, e.g. for inputs of another shape, or after loading
  /// a checkpoint (the loaded optimizer state is in tensors the graph does
  /// not write).
  void reset();

  /// Whether a graph is recorded: the next call replays it.
  bool captured() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp
