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

}  // namespace
