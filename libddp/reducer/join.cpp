#include <ddp/join.h>

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/optim/optimizer.h>

#include <ddp/errors.h>
#include <ddp/grad_scaler.h>

#include "reducer/buffer_sync.h"
#include "reducer/join_state.h"
#include "reducer/model_agreement.h"
#include "reducer/reducer.h"
#include "sharding/sharded_parameters.h"
#include "sharding/unit_schedule.h"

namespace ddp {

Join::Join(std::shared_ptr<detail::DataParallelCore> core, JoinOptions options)
    : core_(std::move(core)), options_(std::move(options)) {
  core_->enter_join(options_);
}

Join::~Join() {
  if (!done_) core_->leave_join();
}

void Join::done() {
  if (done_) return;
  core_->shadow_until_all_joined();
  done_ = true;
}

}  // namespace ddp

namespace ddp::detail {
namespace {

/// One iteration as the ranks agreed on it under a Join.
struct Iteration {
  int active = 0;         ///< Ranks that still have batches.
  int first_active = -1;  ///< The lowest of them: its buffers are broadcast.
  int kind = kEvaluationForward;
  bool train_buffers = false;
};

const char* name_of(int kind) {
  switch (kind) {
    case kEvaluationForward: return "evaluation (no gradients)";
    case kNoSyncForward: return "no_sync()";
    default: return "training";
  }
}

/// The all-reduce every rank makes at each of the active ranks' forwards:
/// who is active, whether this forward records a graph, whether its
/// backward reduces, whether it broadcasts buffers. A rank out of batches
/// offers zeros, and the kinds of forward it cannot repeat (`unrepeatable`,
/// Sharding::kFull), so that all ranks refuse such a forward together.
Iteration agree_on_iteration(Communicator& comm, bool active, bool grad, bool sync_backward, bool train_buffers,
                             const std::array<bool, kJoinForwardKinds>& unrepeatable = {}) {
  const int world = comm.world_size();
  std::vector<std::int32_t> flags(static_cast<std::size_t>(world) * (1 + kJoinForwardKinds) + 3, 0);
  if (active) {
    flags[static_cast<std::size_t>(comm.rank())] = 1;
    flags[world] = grad ? 1 : 0;
    flags[world + 1] = sync_backward ? 1 : 0;
    flags[world + 2] = train_buffers ? 1 : 0;
  }
  for (int kind = 0; kind < kJoinForwardKinds; ++kind) {
    if (unrepeatable[kind]) flags[static_cast<std::size_t>(world + 3 + kind * world + comm.rank())] = 1;
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
  for (int flag = world; flag < world + 3; ++flag) {
    if (sums[flag] == 0 || sums[flag] == it.active) continue;
    throw UsageError(fmt::format(
        "ddp::Join: the {} active ranks disagree on this forward ({} record gradients, {} will reduce them in "
        "backward, {} train BatchNorm-style buffers): every active rank must run the same kind of forward, "
        "training (with one backward), under no_sync(), or evaluation under torch::NoGradGuard",
        it.active, sums[world], sums[world + 1], sums[world + 2]));
  }
  it.kind = join_forward_kind(sums[world] != 0, sums[world + 1] != 0);
  it.train_buffers = sums[world + 2] != 0;
  std::vector<int> cannot_repeat;
  for (int rank = 0; rank < world; ++rank) {
    if (sums[world + 3 + it.kind * world + rank] != 0) cannot_repeat.push_back(rank);
  }
  if (it.active > 0 && !cannot_repeat.empty()) {
    throw UsageError(fmt::format(
        "ddp::Join with Sharding::kFull: rank(s) {} ran out of batches before running a {} forward after their "
        "first forward with gradients, and the active ranks run one now; a rank out of batches repeats the unit "
        "gathers of its own last forward of each kind (the first, which gathers every unit at once, does not "
        "count), so give every rank at least two batches, and run each kind of forward on every rank before "
        "any calls done()",
        fmt::join(cannot_repeat, ", "), name_of(it.kind)));
  }
  return it;
}

/// Over how many ranks the reducer averages an iteration's gradients: the
/// ranks that trained it, or (0) all of them with divide_by_initial_world_size.
int averaging_ranks(const JoinOptions& options, const Iteration& it) {
  return options.divide_by_initial_world_size() ? 0 : it.active;
}

/// Throws UsageError on every rank unless every rank's JoinOptions decide
/// the same collectives and averaging (a scaler, an optimizer or a shadow step
/// on some ranks only made the joined ranks' collectives differ from the
/// others': an abort inside Gloo). Collective; before any refusal of one rank's.
void check_same_join_options_on_all_ranks(Communicator& comm, const JoinOptions& options) {
  const std::vector<std::pair<const char*, bool>> fields{
      {"divide_by_initial_world_size", options.divide_by_initial_world_size()},
      {"grad_scaler", options.grad_scaler() != nullptr},
      {"grad_scaler enabled", options.grad_scaler() != nullptr && options.grad_scaler()->is_enabled()},
      {"optimizer", options.optimizer() != nullptr},
      {"shadow_step", static_cast<bool>(options.shadow_step())}};
  std::vector<std::int64_t> mine;
  for (const auto& field : fields) mine.push_back(field.second ? 1 : 0);
  const auto on_device = at::TensorOptions().dtype(at::kLong).device(comm.device());
  const at::Tensor input = at::tensor(mine, at::kLong).to(comm.device());
  at::Tensor all = at::empty({comm.world_size() * static_cast<std::int64_t>(mine.size())}, on_device);
  comm.all_gather(all, input)->wait();
  all = all.cpu().view({comm.world_size(), static_cast<std::int64_t>(mine.size())});
  for (std::size_t f = 0; f < fields.size(); ++f) {
    const at::Tensor column = all.select(1, static_cast<std::int64_t>(f));
    if (column.min().item<std::int64_t>() != column.max().item<std::int64_t>()) {
      std::vector<int> set;
      for (int r = 0; r < comm.world_size(); ++r) {
        if (column[r].item<std::int64_t>() != 0) set.push_back(r);
      }
      throw UsageError(
          fmt::format("ddp::Join: JoinOptions differ between ranks: {} is set on rank(s) {} only; give "
                      "every rank the same options",
                      fields[f].first, fmt::join(set, ", ")));
    }
  }
}

}  // namespace

void DataParallelCore::enter_join(const JoinOptions& options) {
  check_same_join_options_on_all_ranks(process_group_->communicator(), options);
  const Sharding sharding = options_.sharding();
  if (sharded_ && options.optimizer() == nullptr && !options.shadow_step()) {
    throw UsageError(
        fmt::format("ddp::Join with Sharding::{} needs the optimizer, JoinOptions().optimizer(&optimizer) (or a "
                    "JoinOptions().shadow_step(...) that steps it): each rank owns 1/N of the parameters and must keep "
                    "stepping its shard after it runs out of batches",
                    to_string(sharding)));
  }
  if (sharding == Sharding::kFull && options_.find_unused_parameters()) {
    throw UsageError(
        "ddp::Join cannot join Sharding::kFull with find_unused_parameters: a rank out of batches repeats the "
        "unit gathers of its own last forward, which need not be the units the others use now; train with "
        "Sharding::kGradients, or use every parameter in every iteration");
  }
  join_ = std::make_unique<JoinState>();
  join_->options = options;
}

void DataParallelCore::leave_join() {
  join_.reset();
  reducer_->set_averaging_ranks(0);
}

int DataParallelCore::agree_on_active_forward() {
  if (reducer_->backward_due()) {
    // The joined ranks repeat a training forward's backward as soon as they agree on the forward: they wait in
    // its reductions now, and this forward's agreement would meet them (an abort inside the backend). Refused
    // here, before any collective; the joined ranks' reductions then fail, naming this rank.
    throw UsageError(fmt::format(
        "ddp::Join: rank {} began a forward while the backward of its training forward before was still due; under "
        "a Join run each backward before the next forward (a forward that needs no backward: under "
        "torch::NoGradGuard, after the backward)",
        process_group_->rank()));
  }
  const bool grad = at::GradMode::is_enabled();
  const Iteration it = agree_on_iteration(process_group_->communicator(), true, grad, grad && reducer_->sync(),
                                          buffer_sync_ != nullptr && module_->is_training());
  ++join_->forwards;
  reducer_->set_averaging_ranks(averaging_ranks(join_->options, it));
  return it.first_active;
}

void DataParallelCore::shadow_until_all_joined() {
  if (!join_) throw UsageError("ddp::Join::done(): the model is not in join mode");
  if (sharded_) sharded_->stop_recording();  // what it repeats is its own last forward's
  std::array<bool, kJoinForwardKinds> unrepeatable{};
  if (options_.sharding() == Sharding::kFull) {
    for (int kind = 0; kind < kJoinForwardKinds; ++kind) unrepeatable[kind] = sharded_->recorded(kind) == nullptr;
  }
  Communicator& comm = process_group_->communicator();
  for (;;) {
    const Iteration it = agree_on_iteration(comm, false, false, false, false, unrepeatable);
    if (it.active == 0) break;
    reducer_->set_averaging_ranks(averaging_ranks(join_->options, it));
    shadow_iteration(it.kind, it.train_buffers, it.first_active);
  }
  // Ranks that stopped early kept older parameters: every rank takes those
  // of the rank that ran the most forwards (the highest such rank). (With
  // sharding each rank stepped its own shard throughout; frozen parameters
  // never left the values DDP gave every rank at the start.)
  const auto long_options = at::TensorOptions().dtype(at::kLong).device(comm.device());
  at::Tensor most = at::full({1}, join_->forwards, long_options);
  comm.all_reduce(most, ReduceOp::kMax)->wait();
  const bool longest = join_->forwards == most.cpu().item<std::int64_t>();
  at::Tensor root = at::full({1}, longest ? comm.rank() : -1, long_options);
  comm.all_reduce(root, ReduceOp::kMax)->wait();
  const int source = static_cast<int>(root.cpu().item<std::int64_t>());
  std::vector<at::Tensor> state = sharded_ ? std::vector<at::Tensor>{} : trained_;
  for (const at::Tensor& buffer : module_->buffers()) state.push_back(buffer);
  if (!state.empty()) broadcast_coalesced(comm, state, source);
  torch::optim::Optimizer* optimizer = join_->options.optimizer();
  if (!sharded_ && optimizer != nullptr) broadcast_optimizer_state(*optimizer, source);
  leave_join();
}

void DataParallelCore::shadow_iteration(int kind, bool train_buffers, int buffer_root) {
  Communicator& comm = process_group_->communicator();
  {
    // DDP's bucket rebuild, when due, is collective: as the active ranks'
    // forward does it, which an evaluation forward (no autograd) does not.
    const at::AutoGradMode grad(kind != kEvaluationForward);
    reducer_->prepare_for_forward();
  }
  if (sharded_) {
    sharded_->gather(/*defer_units=*/units_ && units_->checked());
    for (std::size_t bucket = 0; bucket < sharded_->bucket_count(); ++bucket) sharded_->settle(bucket);
  }
  if (buffer_sync_ && train_buffers) buffer_sync_->broadcast(comm, buffer_root);
  const bool sync = kind == kSynchronisedForward;
  if (options_.sharding() == Sharding::kFull) {
    // Unit gathers and reductions come in the order autograd's hooks issued
    // them: repeat this rank's own last forward (and backward) of the kind.
    const std::vector<ShardedCollective>* collectives = sharded_->recorded(kind);
    TORCH_INTERNAL_ASSERT(collectives != nullptr, "agree_on_iteration let through a forward this rank cannot repeat");
    if (sync) reducer_->begin_shadow_backward();
    for (const ShardedCollective& collective : *collectives) {
      if (collective.kind == ShardedCollective::kReduce) {
        reducer_->shadow_bucket(collective.bucket);
        continue;
      }
      sharded_->finish_gather(collective.bucket);
      sharded_->release(collective.bucket);
    }
    if (sync) reducer_->finalize_backward();
  } else if (sync) {
    reducer_->shadow_backward();
  }
  if (sync) shadow_step();
}

void DataParallelCore::shadow_step() {
  const JoinOptions& options = join_->options;
  GradScaler* scaler = options.grad_scaler();
  if (!sharded_) {  // the parameters come from the longest rank at the end
    if (scaler != nullptr) scaler->shadow_step();
    return;
  }
  // A rank that had no batch at all never called scale(): scaling a zero
  // loss gives its scaler the scale the others started from, which its
  // step unscales its shard of their gradients with.
  if (scaler != nullptr) scaler->scale(at::zeros({}, at::TensorOptions().device(process_group_->device())));
  if (options.shadow_step()) {
    options.shadow_step()();
    return;
  }
  torch::optim::Optimizer& optimizer = *options.optimizer();
  if (scaler != nullptr) {
    scaler->step(optimizer);
    scaler->update();
  } else {
    optimizer.step();
  }
  optimizer.zero_grad();
}

}  // namespace ddp::detail
