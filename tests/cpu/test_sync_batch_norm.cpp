// ddp::SyncBatchNorm over Gloo: one process's BatchNorm on the ranks'
// batches laid end to end, in forward, backward and the running statistics.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "support/collective_checks.h"
#include "support/multiprocess.h"
#include "support/sync_batch_norm_scenarios.h"

namespace {

using namespace ddp::testing;

std::shared_ptr<ddp::ProcessGroup> init_gloo() {
  return ddp::init(ddp::InitOptions().backend(ddp::Backend::kGloo).timeout(std::chrono::seconds(60)));
}

TEST(SyncBatchNormGloo, TwoRanksWithDifferentBatchSizesMatchOneProcess) {
  expect_all_succeeded(run_ranks(2, [](int) { check_sync_batch_norm_matches_one_process(init_gloo(), {3, 5}); }));
}

// A rank with no images still joins the statistics' collectives.
TEST(SyncBatchNormGloo, ThreeRanksOneWithAnEmptyBatchMatchOneProcess) {
  expect_all_succeeded(run_ranks(3, [](int) { check_sync_batch_norm_matches_one_process(init_gloo(), {4, 0, 2}); }));
}

// Its backward collectives interleave with DDP's bucket reductions.
TEST(SyncBatchNormGloo, UnderDdpTrainsAsOneProcessOnTheWholeBatch) {
  expect_all_succeeded(run_ranks(2, [](int) { check_sync_batch_norm_under_ddp_matches_one_process(init_gloo()); }));
}

// fused_batch_norm with a process group (BatchNorm over the ranks' batches,
// add and ReLU), and SyncBatchNorm in the layout of the fused kernels: on
// the CPU both take sync_batch_norm, whose result the CUDA kernels match.
TEST(SyncBatchNormGloo, FusedWithResidualAndReluMatchesOneProcess) {
  expect_all_succeeded(run_ranks(3, [](int) {
    check_fused_sync_batch_norm_matches_one_process(init_gloo(), {4, 0, 2}, torch::kFloat, 1e-4,
                                                    /*fused_kernels=*/false);
  }));
}

// As PyTorch's: evaluation never synchronises, also without running
// statistics (each rank normalises with its own batch's), so ranks may
// evaluate different numbers of batches; training afterwards still does.
TEST(SyncBatchNormGloo, EvaluationWithoutRunningStatisticsStaysOnItsRank) {
  expect_all_succeeded(run_ranks(2, [](int rank) {
    auto pg = ddp::init(ddp::InitOptions().backend(ddp::Backend::kGloo).timeout(std::chrono::seconds(10)));
    ddp::SyncBatchNorm norm(torch::nn::BatchNormOptions(3).track_running_stats(false), pg);
    const auto batch = [](int seed, int64_t n) {
      return torch::randn({n, 3, 2, 2}, at::detail::createCPUGenerator(seed)) * (seed + 1) + seed;
    };
    norm->eval();
    for (int i = 0; i < (rank == 0 ? 2 : 1); ++i) {
      const torch::Tensor x = batch(10 * rank + i, 2 + rank);
      const torch::Tensor local = torch::batch_norm(x, norm->weight, norm->bias, {}, {}, true, 0.1, 1e-5, false);
      require(torch::allclose(norm(x), local, 1e-5, 1e-5), "rank " + std::to_string(rank) + ", evaluation batch " +
                                                               std::to_string(i) + " differs from its own BatchNorm");
    }
    norm->train();
    const torch::Tensor mine = batch(100 + rank, 3), other = batch(101 - rank, 3);
    const torch::Tensor whole = rank == 0 ? torch::cat({mine, other}) : torch::cat({other, mine});
    const torch::Tensor expected = torch::batch_norm(whole, norm->weight, norm->bias, {}, {}, true, 0.1, 1e-5, false);
    require(torch::allclose(norm(mine), expected.narrow(0, 3 * rank, 3), 1e-5, 1e-5),
            "rank " + std::to_string(rank) + ", training after evaluation differs from BatchNorm on both batches");
  }));
}

TEST(SyncBatchNormGloo, InputOfTheWrongShapeIsRefused) {
  expect_all_succeeded(run_ranks(1, [](int) {
    ddp::SyncBatchNorm norm(torch::nn::BatchNormOptions(3), init_gloo());
    require_usage_error(
        [&] {
          norm(torch::zeros({2, 4, 5, 5}));
        },
        "ddp::SyncBatchNorm(3): input must be [N, 3, ...], got [2, 4, 5, 5]");
  }));
}

}  // namespace
