#include "support/join_scenarios.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <thread>

#include <torch/torch.h>

#include "support/collective_checks.h"
#include "support/multiprocess.h"

namespace ddp::testing {
namespace {

struct NetImpl : torch::nn::Module {
  explicit NetImpl(bool batch_norm)
      : first(register_module("first", torch::nn::Linear(8, 16))),
        second(register_module("second", torch::nn::Linear(16, 4))),
        side(register_module("side", torch::nn::Linear(16, 4))) {
    if (batch_norm) norm = register_module("norm", torch::nn::BatchNorm1d(16));
  }
  // Sharding::kFull gathers first and second inside in_unit; elsewhere in_unit just runs them.
  torch::Tensor forward(const torch::Tensor& x, bool use_side) {
    torch::Tensor h = torch::tanh(in_unit(*first, [&] { return first(x); }));
    if (norm) h = norm(h);
    torch::Tensor out = in_unit(*second, [&] { return second(h); });
    return use_side ? out + side(h) : out;
  }
  torch::nn::Linear first, second, side;
  torch::nn::BatchNorm1d norm{nullptr};
};
TORCH_MODULE(Net);

struct Batch {
  torch::Tensor x, y;
};

Batch batch_of(int rank, int step, int micro, bool poison, const torch::Device& device) {
  auto generator = at::detail::createCPUGenerator(10000 * step + 100 * micro + rank);
  Batch batch{torch::randn({6, 8}, generator), torch::randn({6, 4}, generator)};
  if (poison) batch.x[0][0] = INFINITY;
  return {batch.x.to(device), batch.y.to(device)};
}

bool uses_side(const JoinScenario& s, int rank, int step) { return !s.side_branch || (step + rank) % 2 == 0; }
bool poisoned(const JoinScenario& s, int rank, int step) {
  return s.grad_scaler && rank == static_cast<int>(s.batches.size()) - 1 && step == 1;
}

torch::optim::SGDOptions sgd_options() { return torch::optim::SGDOptions(0.1).momentum(0.9); }

Net make_net(const JoinScenario& s, const torch::Device& device) {
  torch::manual_seed(0);
  Net net(s.batch_norm);
  net->to(device);
  return net;
}

/// One process: at each step, the mean loss of each rank that still had a
/// batch, summed and divided by the world size (or by those ranks).
Net train_one_process(const JoinScenario& s, const torch::Device& device) {
  Net net = make_net(s, device);
  torch::optim::SGD optimizer(net->parameters(), sgd_options());
  const int world = static_cast<int>(s.batches.size());
  const int uneven = *std::max_element(s.batches.begin(), s.batches.end());
  for (int step = 0; step < uneven + s.steps_after_join; ++step) {
    std::vector<int> active;
    for (int rank = 0; rank < world; ++rank) {
      if (step < s.batches[static_cast<std::size_t>(rank)] || step >= uneven) active.push_back(rank);
    }
    const bool skipped = std::any_of(active.begin(), active.end(), [&](int r) { return poisoned(s, r, step); });
    const double divisor = s.divide_by_initial_world_size ? world : static_cast<double>(active.size());
    optimizer.zero_grad();
    for (int rank : active) {
      for (int micro = 0; micro < s.micro_batches; ++micro) {
        const Batch b = batch_of(rank, step, micro, false, device);
        const torch::Tensor loss = torch::mse_loss(net->forward(b.x, uses_side(s, rank, step)), b.y);
        (loss / (divisor * s.micro_batches)).backward();
      }
    }
    if (!skipped) optimizer.step();
  }
  return net;
}

/// Every rank must hold the same value: its max over the ranks, and the max of its negation, agree with it.
void require_same_on_every_rank(Communicator& comm, const torch::Tensor& value, const std::string& what) {
  torch::Tensor high = value.detach().to(comm.device(), torch::kDouble), low = -high;
  comm.all_reduce(high, ReduceOp::kMax)->wait();
  comm.all_reduce(low, ReduceOp::kMax)->wait();
  require(torch::equal(high, -low), what + " differs between ranks after done()");
}

}  // namespace

void check_join_matches_one_process(const std::shared_ptr<ProcessGroup>& pg, const JoinScenario& s) {
  const int rank = pg->rank();
  Net net = make_net(s, pg->device());
  auto options = DistributedDataParallelOptions().find_unused_parameters(s.side_branch).sharding(s.sharding);
  if (s.sharding != Sharding::kNone) options.shard_units({"first", "second"});
  DistributedDataParallel<Net> model(net, pg, options);
  torch::optim::SGD optimizer(model.parameters(), sgd_options());
  GradScaler scaler(GradScalerOptions().enabled(s.grad_scaler).init_scale(1024), pg);
  const auto train_step = [&](int step) {
    if (s.evaluate_each_step) {
      torch::NoGradGuard no_grad;
      model(batch_of(rank, step, 0, false, pg->device()).x, uses_side(s, rank, step));
    }
    optimizer.zero_grad();
    for (int micro = 0; micro < s.micro_batches; ++micro) {
      std::optional<DistributedDataParallel<Net>::NoSyncGuard> no_sync;
      if (micro + 1 < s.micro_batches) no_sync.emplace(model.no_sync());
      const Batch b = batch_of(rank, step, micro, poisoned(s, rank, step), pg->device());
      const torch::Tensor loss = torch::mse_loss(model(b.x, uses_side(s, rank, step)), b.y) / s.micro_batches;
      scaler.scale(loss).backward();
    }
    scaler.step(optimizer);
    scaler.update();
  };
  {
    Join join(model, JoinOptions()
                         .divide_by_initial_world_size(s.divide_by_initial_world_size)
                         .grad_scaler(&scaler)
                         .optimizer(s.steps_after_join > 0 || s.sharding != Sharding::kNone ? &optimizer : nullptr));
    for (int step = 0; step < s.batches[static_cast<std::size_t>(rank)]; ++step) train_step(step);
    join.done();
  }
  // Buffers are the longest rank's (each forward after this trains them on its own batch).
  auto& comm = pg->communicator();
  for (const auto& item : net->named_buffers()) require_same_on_every_rank(comm, item.value(), item.key());
  // Then steps every rank trains, numbered after the longest rank's.
  const int uneven = *std::max_element(s.batches.begin(), s.batches.end());
  for (int step = uneven; step < uneven + s.steps_after_join; ++step) train_step(step);

  const Net reference = train_one_process(s, pg->device());
  const auto expected = reference->named_parameters();
  model.gather_parameters();
  for (const auto& item : net->named_parameters()) {
    require(torch::allclose(item.value(), expected[item.key()], 1e-5, 1e-6),
            "rank " + std::to_string(rank) + ": " + item.key() + " differs from one process's");
  }
  require_same_on_every_rank(comm, torch::tensor({scaler.get_scale()}), "the GradScaler's scale");
  if (s.grad_scaler) require(scaler.get_scale() == 512, "the inf step did not back the scale off on every rank");
}

void check_exit_without_join_is_named(const std::shared_ptr<ProcessGroup>& pg) {
  const int rank = pg->rank();
  const JoinScenario s{{4, 1}};
  Net net = make_net(s, pg->device());
  DistributedDataParallel<Net> model(net, pg);
  Join join(model);
  const std::string message = collective_error_of([&] {
    for (int step = 0; step < s.batches[static_cast<std::size_t>(rank)]; ++step) {
      const Batch b = batch_of(rank, step, 0, false, pg->device());
      torch::mse_loss(model(b.x, true), b.y).backward();
    }
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(1));         // lets the watchdogs (every 0.1 s) publish progress
      std::_Exit(0);                                                // forgets join.done()
    }
    join.done();
  });
  require_contains(message, "rank 1: issued #");
}

}  // namespace ddp::testing
