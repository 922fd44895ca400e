// Sharded data parallelism on CUDA over NCCL at world size 1: each mode trains
// as plain DDP and one process, with ATen's fused AdamW kernel stepping the
// shards' fragments. (The 2-GPU runs are in test_ddp_nccl.cpp.)

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "support/multiprocess.h"
#include "support/sharding_scenarios.h"

namespace {

using namespace ddp::testing;

TEST(ShardingCuda, EveryModeTrainsAsPlainDdpOnOneGpu) {
  expect_all_succeeded(run_ranks(1, [](int) {
    auto pg = ddp::init(ddp::InitOptions().backend(ddp::Backend::kNccl).timeout(std::chrono::seconds(60)));
    for (ddp::Sharding sharding : {ddp::Sharding::kOptimizer, ddp::Sharding::kGradients}) {
      for (bool fused : {false, true}) {
        ShardingScenario scenario;
        scenario.sharding = sharding;
        scenario.fused_optimizer = fused;
        scenario.options.bucket_cap_mb(0.001).first_bucket_cap_mb(0.0005);
        check_sharded_matches(*pg, scenario);
        scenario.model = ShardedModel::kBranchy;
        scenario.options.find_unused_parameters(true);
        scenario.micro_steps = 2;
        scenario.clip = 0.05;
        check_sharded_matches(*pg, scenario);
      }
    }
    check_memory_report(*pg);
  }));
}

// On one rank a reduce-scatter has nothing to do and its end on the
// timeline comes before the end of backward's compute: the timings must wait
// for both (they once read the compute's event before it completed).
TEST(ShardingCuda, TimelineOfNoOpReductionsResolves) {
  expect_all_succeeded(run_ranks(1, [](int) {
    auto pg = ddp::init(ddp::InitOptions().backend(ddp::Backend::kNccl).timeout(std::chrono::seconds(60)));
    torch::nn::Sequential net(torch::nn::Linear(1024, 1024), torch::nn::Tanh(), torch::nn::Linear(1024, 1024));
    net->to(pg->device());
    ddp::DistributedDataParallel<torch::nn::Sequential> model(
        net, pg, ddp::DistributedDataParallelOptions().sharding(ddp::Sharding::kGradients).record_timeline(true));
    const auto input = torch::randn({4096, 1024}, torch::TensorOptions().device(pg->device()));
    for (int step = 0; step < 3; ++step) model(input).square().mean().backward();
    const auto timings = model.timings();
    require(timings.size() == 3, "expected 3 timed backward passes, got " + std::to_string(timings.size()));
    for (const auto& timing : timings) require(timing.backward_ms > 0, "a backward took no time");
  }));
}

}  // namespace
