#pragma once

#include <functional>
#include <memory>

#include <torch/arg.h>

#include <ddp/distributed_data_parallel.h>
#include <ddp/export.h>
#include <ddp/grad_scaler.h>

namespace ddp {

/// How a ddp::Join averages and which GradScaler it keeps in step.
struct DDP_API JoinOptions {
  /// Average the gradients over every rank, counting a rank out of batches
  /// as zeros (PyTorch's default), instead of over the ranks that had a batch.
  TORCH_ARG(bool, divide_by_initial_world_size) = true;

 public:
  /// The GradScaler the step uses, if any: a rank out of batches takes part
  /// in its found-inf agreement (GradScaler::shadow_step). Not owned.
  JoinOptions& grad_scaler(GradScaler* scaler) {
    grad_scaler_ = scaler;
    return *this;
  }
  /// The GradScaler given, or null.
  GradScaler* grad_scaler() const { return grad_scaler_; }
  /// The optimizer that steps the model, if any (SGD, Adam, AdamW and the
  /// fused ones): done() gives every rank its state on the rank that trained
  /// longest, as it does the parameters, so that training can go on as one
  /// replica (e.g. after an epoch's uneven tail). With a sharding mode it is
  /// required: each rank owns 1/N of the parameters and keeps stepping them
  /// after it ran out of batches (see shadow_step). Not owned.
  JoinOptions& optimizer(torch::optim::Optimizer* optimizer) {
    optimizer_ = optimizer;
    return *this;
  }
  /// The optimizer given, or null.
  torch::optim::Optimizer* optimizer() const { return optimizer_; }
  /// Sharding modes: what a rank out of batches runs after each synchronised
  /// backward it meets, in place of the training loop's step: gradient
  /// clipping (a collective there), the GradScaler, the optimizer, an LR
  /// scheduler. Unset: the GradScaler's step and update if one is given,
  /// else the optimizer's step; then its zero_grad(). Plain DDP ignores it.
  JoinOptions& shadow_step(std::function<void()> step) {
    shadow_step_ = std::move(step);
    return *this;
  }
  /// The shadow step given, or an empty function.
  const std::function<void()>& shadow_step() const { return shadow_step_; }

 private:
  GradScaler* grad_scaler_ = nullptr;
  torch::optim::Optimizer* optimizer_ = nullptr;
  std::function<void()> shadow_step_;
};

/// Training with uneven inputs, as PyTorch's Join: ranks may run out of
/// batches at different iterations. While a Join exists every forward of the
/// model first agrees with the other ranks on who is still training (a small
/// all-reduce). A rank that has run out calls done(), which meets the
/// collectives of the others' iterations (bucket reductions of zeros through
/// the comm hook, buffer broadcasts, DDP's bucket rebuild, the used-parameter
/// flags, sparse gradients, the GradScaler's agreement) until every rank has
/// called it; then every rank holds the parameters and buffers of the rank
/// that trained longest (and, given JoinOptions::optimizer, its optimizer
/// state).
///
///   ddp::Join join(model, ddp::JoinOptions().grad_scaler(&scaler));
///   for (auto& batch : my_batches) { ...forward, backward, step... }
///   join.done();
///
/// Every active rank must do the same kind of forward (training with a
/// backward, no_sync, or evaluation under torch::NoGradGuard); a forward with
/// gradients whose backward never runs makes the others wait.
///
/// Sharding modes: a rank out of batches also meets the parameter gathers
/// and reduce-scatters, receives its shard of the averaged gradients and
/// steps it (JoinOptions::optimizer, shadow_step), also where it had no
/// batch at all: its GradScaler starts from the scale the others started
/// from (it scales a zero loss before each shadow step). Sharding::kFull's unit
/// gathers and reductions come in an order autograd decides: the rank
/// repeats those of its own last forward of the same kind, so every forward
/// of a kind must run the same units, each rank must have run one of each
/// kind the others run after it joined (recorded at every forward), and
/// find_unused_parameters is refused there.
class DDP_API Join {
 public:
  /// Puts `model` in join mode until done() or destruction. UsageError for
  /// a sharding mode without JoinOptions::optimizer, and for Sharding::kFull
  /// with find_unused_parameters.
  template <typename ModuleType>
  explicit Join(DistributedDataParallel<ModuleType>& model, JoinOptions options = {}) : Join(model.core_, options) {}
  /// Leaves join mode; it does not join: a rank that never calls done()
  /// leaves the others to their collectives' timeout, which names it.
  ~Join();
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  /// This rank is out of batches: returns when every rank has called done().
  /// Collective.
  void done();

 private:
  Join(std::shared_ptr<detail::DataParallelCore> core, JoinOptions options);

  std::shared_ptr<detail::DataParallelCore> core_;
  JoinOptions options_;
  bool done_ = false;
};

}  // namespace ddp
