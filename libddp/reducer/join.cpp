#include <ddp/join.h>

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <ddp/errors.h>

#include "reducer/buffer_sync.h"
#include "reducer/join_state.h"
#include "reducer/model_agreement.h"
#include "reducer/reducer.h"

namespace ddp {

Join::Join(std::shared_ptr<detail::DataParallelCore> core, JoinOptions options)
    : core_(std::move(core)), options_(options) {
  core_->enter_join(options_.divide_by_initial_world_size());
}

Join::~Join() {
  if (!done_) core_->leave_join();
}

void Join::done() {
  if (done_) return;
  GradScaler* scaler = options_.grad_scaler();
  core_->shadow_until_all_joined(
      [scaler] {
        if (scaler != nullptr) scaler->shadow_step();
      },
      options_.optimizer());
  done_ = true;
}

}  // namespace ddp

namespace ddp::detail {
namespace {

/// One iteration as the ranks agreed on it under a Join.
struct Iteration {
  int active = 0;         ///< Ranks that still have batches.
  int first_active = -1;  ///< The lowest of them: its buffers are broadcast.
  bool sync_backward = false;
  bool train_buffers = false;
};

/// The all-reduce every rank makes at each of the active ranks' forwards:
/// who is active, whether this forward's backward reduces, whether it
/// broadcasts buffers. A rank out of batches offers zeros.
Iteration agree_on_iteration(Communicator& comm, bool active, bool sync_backward, bool train_buffers) {
  const int world = comm.world_size();
  std::vector<std::int32_t> flags(static_cast<std::size_t>(world) + 2, 0);
  if (active) {
    flags[static_cast<std::size_t>(comm.rank())] = 1;
    flags[world] = sync_backward ? 1 : 0;
    flags[world + 1] = train_buffers ? 1 : 0;
  }
  at::Tensor agreed = at::tensor(flags, at::kInt).to(comm.device());
  comm.all_reduce(agreed)->wait();
  agreed = agreed.cpu();
  const auto* sums = agreed.data_ptr<std::int32_t>();
  Iteration it;
  for (int rank = 0; rank < world; ++rank) {
    if (sums[rank] == 0) continue;
    ++it.active;
    if (it.first_active < 0) it.first_active = rank;
  }
  if ((sums[world] != 0 && sums[world] != it.active) || (sums[world + 1] != 0 && sums[world + 1] != it.active)) {
    throw UsageError(fmt::format(
        "ddp::Join: the {} active ranks disagree on this forward ({} will reduce gradients in backward, {} train "
        "BatchNorm-style buffers): every active rank must run the same kind of forward, training (with one "
        "backward), under no_sync(), or evaluation under torch::NoGradGuard",
        it.active, sums[world], sums[world + 1]));
  }
  it.sync_backward = sums[world] != 0;
  it.train_buffers = sums[world + 1] != 0;
  return it;
}

}  // namespace

void DataParallelCore::enter_join(bool divide_by_initial_world_size) {
  if (sharded_) {
    throw UsageError(fmt::format(
        "ddp::Join supports plain DDP (Sharding::kNone) for now, but this model uses Sharding::{}: its parameter "
        "gathers and gradient reduce-scatters are not met by ranks out of batches; drop the batches that do not "
        "split evenly, or train this model without sharding",
        to_string(options_.sharding())));
  }
  join_ = std::make_unique<JoinState>();
  join_->divide_by_initial_world_size = divide_by_initial_world_size;
}

void DataParallelCore::leave_join() {
  join_.reset();
  reducer_->set_averaging_ranks(0);
}

int DataParallelCore::agree_on_active_forward() {
  const Iteration it =
      agree_on_iteration(process_group_->communicator(), true, reducer_->sync() && at::GradMode::is_enabled(),
                         buffer_sync_ != nullptr && module_->is_training());
  ++join_->forwards;
  reducer_->set_averaging_ranks(join_->divide_by_initial_world_size ? 0 : it.active);
  return it.first_active;
}

void DataParallelCore::shadow_until_all_joined(const std::function<void()>& after_synced_backward,
                                               torch::optim::Optimizer* optimizer) {
  if (!join_) throw UsageError("ddp::Join::done(): the model is not in join mode");
  Communicator& comm = process_group_->communicator();
  for (;;) {
    const Iteration it = agree_on_iteration(comm, false, false, false);
    if (it.active == 0) break;
    reducer_->prepare_for_forward();  // DDP's bucket rebuild, when due, is collective
    if (buffer_sync_ && it.train_buffers) buffer_sync_->broadcast(comm, it.first_active);
    if (it.sync_backward) {
      reducer_->shadow_backward();
      after_synced_backward();
    }
  }
  // Ranks that stopped early kept older parameters: every rank takes those
  // of the rank that ran the most forwards (the highest such rank).
  const auto long_options = at::TensorOptions().dtype(at::kLong).device(comm.device());
  at::Tensor most = at::full({1}, join_->forwards, long_options);
  comm.all_reduce(most, ReduceOp::kMax)->wait();
  const bool longest = join_->forwards == most.cpu().item<std::int64_t>();
  at::Tensor root = at::full({1}, longest ? comm.rank() : -1, long_options);
  comm.all_reduce(root, ReduceOp::kMax)->wait();
  const int source = static_cast<int>(root.cpu().item<std::int64_t>());
  // (Frozen parameters never left the values DDP gave every rank at the start.)
  std::vector<at::Tensor> state = trained_;
  for (const at::Tensor& buffer : module_->buffers()) state.push_back(buffer);
  broadcast_coalesced(comm, state, source);
  if (optimizer != nullptr) broadcast_optimizer_state(*optimizer, source);
  leave_join();
}

}  // namespace ddp::detail
