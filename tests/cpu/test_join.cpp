// ddp::Join over Gloo: ranks with different numbers of batches train as one
// process that saw, at each step, the batches of the ranks that still had one.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "support/collective_checks.h"
#include "support/join_scenarios.h"
#include "support/multiprocess.h"

namespace {

using namespace ddp::testing;

std::shared_ptr<ddp::ProcessGroup> init_gloo(int seconds = 60) {
  return ddp::init(ddp::InitOptions().backend(ddp::Backend::kGloo).timeout(std::chrono::seconds(seconds)));
}

void expect_join_matches_one_process(const JoinScenario& s) {
  expect_all_succeeded(
      run_ranks(static_cast<int>(s.batches.size()), [&s](int) { check_join_matches_one_process(init_gloo(), s); }));
}

TEST(JoinGloo, TwoRanksWithTwoBatchesLessOnOneMatchOneProcess) { expect_join_matches_one_process({{3, 5}}); }

// The optimizer's momentum comes from the rank that trained longest, so the
// replicas stay one after the join (an epoch's uneven tail, then more epochs).
TEST(JoinGloo, TrainingGoesOnAsOneReplicaAfterTheJoin) {
  JoinScenario s{{1, 3, 2}};
  s.steps_after_join = 3;
  expect_join_matches_one_process(s);
}

// Four ranks, 1 to 6 batches; averaged over the ranks that had a batch.
TEST(JoinGloo, FourRanksAveragedOverTheActiveOnesMatchOneProcess) {
  JoinScenario s{{6, 1, 4, 2}};
  s.divide_by_initial_world_size = false;
  expect_join_matches_one_process(s);
}

// no_sync micro-batches, a branch some ranks skip, BatchNorm buffers, and a
// GradScaler whose inf step the joined rank must agree on.
TEST(JoinGloo, NoSyncUnusedParametersBuffersAndGradScalerMatchOneProcess) {
  JoinScenario s{{2, 5, 3}};
  s.micro_batches = 2;
  s.side_branch = true;
  s.batch_norm = true;
  s.grad_scaler = true;
  expect_join_matches_one_process(s);
}

// One GradScaler over two optimizers: the joined rank agrees on found-inf
// once per optimizer, as the active ones do (it agreed once: Gloo aborted).
// JoinOptions that differ between ranks are refused on every rank.
TEST(JoinGloo, AScalerOverTwoOptimizersAndOptionsThatDifferBetweenRanks) {
  expect_all_succeeded(run_ranks(2, [](int rank) {
    auto pg = ddp::init(ddp::InitOptions().backend(ddp::Backend::kGloo).timeout(std::chrono::seconds(20)));
    torch::manual_seed(0);
    torch::nn::Sequential net(torch::nn::Linear(4, 4), torch::nn::Linear(4, 2));
    ddp::DistributedDataParallel<torch::nn::Sequential> model(net, pg);
    torch::optim::SGD first(net[0]->parameters(), 0.1), second(net[1]->parameters(), 0.1);
    ddp::GradScaler scaler(ddp::GradScalerOptions().init_scale(1024), pg);
    {
      ddp::Join join(model, ddp::JoinOptions().grad_scaler(&scaler));
      for (int step = 0; step < (rank == 0 ? 3 : 1); ++step) {
        first.zero_grad();
        second.zero_grad();
        scaler.scale(model(torch::full({2, 4}, 1.0 + step + rank)).sum()).backward();
        scaler.step(first);
        scaler.step(second);
        scaler.update();
      }
      join.done();
    }
    for (const auto& [what, value] : {std::pair<std::string, double>{"the scale", scaler.get_scale()},
                                      {"the parameters", net->parameters()[0].sum().item<double>()}}) {
      at::Tensor largest = torch::tensor({value}, torch::kDouble);
      pg->communicator().all_reduce(largest, ddp::ReduceOp::kMax)->wait();
      require(largest.item<double>() == value, "rank " + std::to_string(rank) + ": " + what + " differs");
    }
    require_usage_error([&] { ddp::Join join(model, ddp::JoinOptions().grad_scaler(rank == 0 ? &scaler : nullptr)); },
                        "ddp::Join: JoinOptions differ between ranks: grad_scaler is set on rank(s) 0 only");
  }));
}

// A rank that leaves without done() is named by the others' failure, not waited for.
TEST(JoinGloo, ARankThatExitsWithoutJoiningIsNamed) {
  const auto outcomes = run_ranks(2, [](int) { check_exit_without_join_is_named(init_gloo(10)); });
  EXPECT_EQ(outcomes[0].exit_code, 0) << outcomes[0].error;
  EXPECT_EQ(outcomes[1].exit_code, 0) << outcomes[1].error;
}

// ZeRO-1 and ZeRO-2: a joined rank still owns a shard of the parameters; it
// meets the gathers and reduce-scatters and steps its shard.
JoinScenario sharded_scenario(ddp::Sharding sharding) {
  JoinScenario s{{4, 2, 3}};
  s.sharding = sharding;
  s.micro_batches = 2;
  s.side_branch = true;
  s.grad_scaler = true;
  s.steps_after_join = 1;
  return s;
}

TEST(JoinGloo, OptimizerShardingMatchesOneProcess) {
  expect_join_matches_one_process(sharded_scenario(ddp::Sharding::kOptimizer));
}

TEST(JoinGloo, GradientShardingAveragedOverTheActiveRanksMatchesOneProcess) {
  JoinScenario s = sharded_scenario(ddp::Sharding::kGradients);
  s.divide_by_initial_world_size = false;
  expect_join_matches_one_process(s);
}

// A rank with no batch at all joins before its first forward: it has seen no
// unit run, yet meets the others' gathers in their order, and its GradScaler
// agrees on the inf step of a rank that trains.
TEST(JoinGloo, OptimizerShardingWithARankThatHasNoBatchMatchesOneProcess) {
  JoinScenario s = sharded_scenario(ddp::Sharding::kOptimizer);
  s.batches = {4, 0, 3};
  expect_join_matches_one_process(s);
}

TEST(JoinGloo, GradientShardingWithARankThatHasNoBatchMatchesOneProcess) {
  JoinScenario s = sharded_scenario(ddp::Sharding::kGradients);
  s.batches = {0, 4, 3};
  s.divide_by_initial_world_size = false;
  expect_join_matches_one_process(s);
}

// kFull: the joined rank repeats the unit gathers and reductions of its own
// last forward of each kind (training and evaluation here).
TEST(JoinGloo, FullShardingMatchesOneProcess) {
  JoinScenario s{{2, 5, 3}};
  s.sharding = ddp::Sharding::kFull;
  s.batch_norm = true;
  s.evaluate_each_step = true;
  s.divide_by_initial_world_size = false;
  s.steps_after_join = 1;
  expect_join_matches_one_process(s);
}

// kFull: a rank that joins after its first forward only (which gathers every unit at once) or with no forward
// cannot repeat the others' unit-by-unit gathers: every rank is refused at the others' next forward (one batch:
// Gloo aborted every rank; no batch: the others waited for the collective's timeout).
TEST(JoinGloo, FullShardingWithARankThatRanOnlyItsFirstForwardIsRefusedOnEveryRank) {
  expect_all_succeeded(run_ranks(2, [](int) {
    auto pg = init_gloo(20);
    for (const int batches : {1, 0}) {
      JoinScenario s{{3, batches}};
      s.sharding = ddp::Sharding::kFull;
      require_usage_error([&] { check_join_matches_one_process(pg, s); },
                          "rank(s) 1 ran out of batches before running a training forward after their first forward "
                          "with gradients");
    }
  }));
}

struct TwoUnitsImpl : torch::nn::Module {
  TwoUnitsImpl() : a(register_module("a", torch::nn::Linear(4, 4))), b(register_module("b", torch::nn::Linear(4, 2))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor h = ddp::in_unit(*a, [&] { return a(x); });
    return ddp::in_unit(*b, [&] { return b(h); });
  }
  torch::nn::Linear a, b;
};
TORCH_MODULE(TwoUnits);

// A forward between a training forward and its backward, under a Join: the joined rank repeats that backward as
// soon as it agrees on the training forward, so the next forward's agreement met its reductions (Gloo aborted
// both ranks). The active rank is refused before any collective; the joined rank's reduction fails, naming it.
TEST(JoinGloo, AForwardWhileABackwardIsDueIsRefusedBeforeAnyCollective) {
  expect_all_succeeded(run_ranks(2, [](int rank) {
    auto pg = init_gloo(20);
    ddp::DistributedDataParallel<torch::nn::Linear> model(torch::nn::Linear(4, 3), pg);
    ddp::Join join(model);
    if (rank == 1) {
      require_contains(collective_error_of([&] { join.done(); }), "rank 1 of 2");
      return;
    }
    const torch::Tensor loss = model(torch::ones({2, 4})).sum();
    require_usage_error(
        [&] {
          torch::NoGradGuard no_grad;
          model(torch::ones({2, 4}));
        },
        "ddp::Join: rank 0 began a forward while the backward of its training forward before was still due");
  }));
}

// With kFull a forward without gradients between a forward and its backward would release units that backward
// needs: refused, and the backward then runs as if it had not been tried.
TEST(ShardingGloo, AForwardWithoutGradientsWhileABackwardIsDueIsRefusedUnderFullSharding) {
  expect_all_succeeded(run_ranks(2, [](int) {
    auto pg = init_gloo(20);
    ddp::DistributedDataParallel<TwoUnits> full(
        TwoUnits(), pg, ddp::DistributedDataParallelOptions().sharding(ddp::Sharding::kFull).shard_units({"a", "b"}));
    const torch::Tensor loss = full(torch::ones({2, 4})).sum();
    require_usage_error(
        [&] {
          torch::NoGradGuard no_grad;
          full(torch::ones({2, 4}));
        },
        "Sharding::kFull: a forward without gradients began while the backward of the training forward");
    loss.backward();
  }));
}

TEST(JoinGloo, ShardingWithoutTheOptimizerOrWithUnusedUnitsIsRefused) {
  expect_all_succeeded(run_ranks(2, [](int) {
    auto pg = init_gloo();
    torch::nn::Linear net(4, 4);
    ddp::DistributedDataParallel<torch::nn::Linear> model(
        net, pg, ddp::DistributedDataParallelOptions().sharding(ddp::Sharding::kGradients));
    require_usage_error([&] { ddp::Join join(model); }, "needs the optimizer, JoinOptions().optimizer(&optimizer)");
    torch::nn::Sequential full_net(torch::nn::Linear(4, 4));
    ddp::DistributedDataParallel<torch::nn::Sequential> full(full_net, pg,
                                                             ddp::DistributedDataParallelOptions()
                                                                 .sharding(ddp::Sharding::kFull)
                                                                 .shard_units({"0"})
                                                                 .find_unused_parameters(true));
    torch::optim::SGD optimizer(full.parameters(), torch::optim::SGDOptions(0.1));
    require_usage_error([&] { ddp::Join join(full, ddp::JoinOptions().optimizer(&optimizer)); },
                        "cannot join Sharding::kFull with find_unused_parameters");
  }));
}

}  // namespace
