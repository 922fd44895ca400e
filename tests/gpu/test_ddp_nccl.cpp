// DistributedDataParallel over NCCL on 2 GPUs: the same equivalence with
// single-process training as over Gloo. Exits with 77 (skipped) without 2 GPUs.

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "support/ddp_scenarios.h"
#include "support/multiprocess.h"

namespace {

using namespace ddp::testing;

std::shared_ptr<ddp::ProcessGroup> init_nccl() {
  return ddp::init(ddp::InitOptions().backend(ddp::Backend::kNccl).timeout(std::chrono::seconds(60)));
}

TEST(DdpNccl, MlpAndConvNetMatchSingleProcess) {
  expect_all_succeeded(run_ranks(2, [](int) {
    auto pg = init_nccl();
    check_matches_single_process(*pg, Scenario{});
    Scenario conv;
    conv.model = Model::kConvBatchNorm;
    conv.tolerance = 1e-4;  // cuDNN picks different convolution algorithms for different batch layouts
    check_matches_single_process(*pg, conv);
    conv.channels_last = true;
    check_matches_single_process(*pg, conv);
  }));
}

TEST(DdpNccl, UnusedBranchNoSyncAndBucketSizesMatchSingleProcess) {
  expect_all_succeeded(run_ranks(2, [](int) {
    auto pg = init_nccl();
    Scenario branchy;
    branchy.model = Model::kBranchy;
    branchy.steps = 4;
    branchy.options.find_unused_parameters(true);
    check_matches_single_process(*pg, branchy);
    Scenario accumulate;
    accumulate.micro_steps = 3;
    check_matches_single_process(*pg, accumulate);
    Scenario tiny;
    tiny.options.bucket_cap_mb(1e-6).first_bucket_cap_mb(1e-6).gradient_as_bucket_view(false);
    check_matches_single_process(*pg, tiny);
    Scenario compressed;
    compressed.options.comm_hook(ddp::comm_hooks::average_in(torch::kBFloat16));
    compressed.tolerance = 1e-2;
    check_matches_single_process(*pg, compressed);
  }));
}

TEST(DdpNccl, MisuseIsReported) {
  expect_all_succeeded(run_ranks(2, [](int) {
    auto pg = init_nccl();
    check_model_mismatch_is_reported(*pg);
    check_unused_parameter_is_reported(*pg);
  }));
}

}  // namespace
