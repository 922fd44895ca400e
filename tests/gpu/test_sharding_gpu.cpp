// Sharded data parallelism on CUDA over NCCL at world size 1: each mode trains
// as plain DDP and one process, with ATen's fused AdamW kernel stepping the
// shards' fragments. (The 2-GPU runs are in test_ddp_nccl.cpp.)

#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "support/collective_checks.h"
#include "support/multiprocess.h"
#include "support/remove_tree.h"
#include "support/sharding_scenarios.h"
#include "support/float8_gpu.h"

namespace {

using namespace ddp::testing;

TEST(ShardingCuda, EveryModeTrainsAsPlainDdpOnOneGpu) {
  expect_all_succeeded(run_ranks(1, [](int) {
    auto pg = ddp::init(ddp::InitOptions().backend(ddp::Backend::kNccl).timeout(std::chrono::seconds(60)));
    check_every_mode_on_one_rank(*pg, /*fused=*/false);
    check_every_mode_on_one_rank(*pg, /*fused=*/true);
    UnitGathering bf16;  // FSDP's param_dtype: the gather is a cast to bf16 units, fp32 masters
    bf16.param_dtype = at::kBFloat16;
    bf16.tolerance = 2e-5;
    for (const auto sharding : {ddp::Sharding::kFull, ddp::Sharding::kGradients, ddp::Sharding::kOptimizer}) {
      bf16.sharding = sharding;
      check_units_gather_one_at_a_time(*pg, bf16);
    }
  }));
}

// The optimizer state of CUDA fragments, saved whole or sharded in one mode
// and loaded in another, resumes as one process would.
TEST(ShardingCuda, OptimizerStateCheckpointResumesInAnotherMode) {
  expect_all_succeeded(run_ranks(1, [](int) {
    auto pg = ddp::init(ddp::InitOptions().backend(ddp::Backend::kNccl).timeout(std::chrono::seconds(60)));
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("ddp_sharding_gpu_checkpoint_" + std::to_string(::getpid()) + ".pt")).string();
    save_after_steps(*pg, ddp::Sharding::kGradients, 3, path);
    check_resume_matches(*pg, ddp::Sharding::kOptimizer, 3, path);
    save_after_steps(*pg, ddp::Sharding::kNone, 2, path);
    check_resume_matches(*pg, ddp::Sharding::kGradients, 2, path);
    save_after_steps(*pg, ddp::Sharding::kFull, 2, path);
    check_resume_matches(*pg, ddp::Sharding::kFull, 2, path);
    save_after_steps(*pg, ddp::Sharding::kOptimizer, 2, path);  // host tensors into plain DDP's module on the GPU
    check_resume_matches(*pg, ddp::Sharding::kNone, 2, path);
    std::filesystem::remove(path);
    const std::string directory = path + ".sharded";  // a file per rank and a manifest
    save_after_steps(*pg, ddp::Sharding::kFull, 3, directory, CheckpointFormat::kSharded);
    check_resume_matches(*pg, ddp::Sharding::kNone, 3, directory, CheckpointFormat::kSharded);
    save_after_steps(*pg, ddp::Sharding::kNone, 2, directory, CheckpointFormat::kSharded);
    check_resume_matches(*pg, ddp::Sharding::kGradients, 2, directory, CheckpointFormat::kSharded);
    remove_tree(directory);
  }));
}

// Float8Linear's delayed-scaling state (amax histories and scales) is part
// of the model's checkpoint in every mode and format: a resumed FP8 run casts
// with the scales it had, not with a fresh layer's, and continues bit for bit.
TEST(ShardingCuda, Float8DelayedScalingSurvivesEveryCheckpointFormat) {
  DDP_SKIP_WITHOUT_FLOAT8();
  expect_all_succeeded(run_ranks(1, [](int) {
    auto pg = ddp::init(ddp::InitOptions().backend(ddp::Backend::kNccl).timeout(std::chrono::seconds(60)));
    const auto recipe = ddp::Float8Options().scaling(ddp::Float8Scaling::kDelayed).amax_history_len(4);
    const auto make = [&](ddp::Sharding sharding) {
      torch::manual_seed(0);
      torch::nn::Sequential net(ddp::Float8Linear(torch::nn::LinearOptions(64, 64).bias(false), recipe),
                                torch::nn::ReLU(),
                                ddp::Float8Linear(torch::nn::LinearOptions(64, 32).bias(false), recipe));
      net->to(pg->device());
      return ddp::DistributedDataParallel<torch::nn::Sequential>(
          net, pg, ddp::DistributedDataParallelOptions().sharding(sharding));
    };
    // Small inputs: a fresh layer's scales cast them far more coarsely than trained ones.
    const auto train = [&](auto& model, torch::optim::SGD& sgd, int step) {
      torch::manual_seed(100 + step);
      const auto input = torch::randn({16, 64}, torch::TensorOptions().device(pg->device()).dtype(torch::kBFloat16));
      sgd.zero_grad();
      const auto output = model(input * 1e-3);
      output.to(torch::kFloat).square().sum().backward();
      sgd.step();
      return output.detach();
    };
    const std::string path =
        (std::filesystem::temp_directory_path() / ("ddp_float8_scaling_checkpoint_" + std::to_string(::getpid())))
            .string();
    // kGradients writes the module through save_module's sharded path, as kFull and kOptimizer do.
    for (const auto sharding : {ddp::Sharding::kNone, ddp::Sharding::kGradients}) {
      for (const bool sharded_format : {false, true}) {
        const std::string what = ddp::to_string(sharding) + (sharded_format ? ", sharded checkpoint" : ", save_module");
        auto trained = make(sharding);
        torch::optim::SGD trained_sgd(trained.parameters(), torch::optim::SGDOptions(0.01));
        for (int step = 0; step < 3; ++step) train(trained, trained_sgd, step);
        if (sharded_format) {
          trained.save_sharded_checkpoint(path);
        } else {
          torch::serialize::OutputArchive archive;
          trained.save_module(archive);
          archive.save_to(path);
        }
        auto resumed = make(sharding);
        if (sharded_format) {
          // The same parameters, but the second layer without FP8: its saved
          // scaling state has no layer to go to, and loading says so by name.
          torch::manual_seed(0);
          torch::nn::Sequential plain_tail(ddp::Float8Linear(torch::nn::LinearOptions(64, 64).bias(false), recipe),
                                           torch::nn::ReLU(),
                                           torch::nn::Linear(torch::nn::LinearOptions(64, 32).bias(false)));
          plain_tail->to(pg->device());
          ddp::DistributedDataParallel<torch::nn::Sequential> other(
              plain_tail, pg, ddp::DistributedDataParallelOptions().sharding(sharding));
          require_usage_error([&] { other.load_sharded_checkpoint(path); },
                              "holds the FP8 scaling state of a Float8Linear '2' that this model does not have");
          resumed.load_sharded_checkpoint(path);
          remove_tree(path);
        } else {
          torch::serialize::InputArchive archive;
          archive.load_from(path);
          resumed.load_module(archive);
          std::filesystem::remove(path);
        }
        torch::optim::SGD resumed_sgd(resumed.parameters(), torch::optim::SGDOptions(0.01));
        for (int step = 3; step < 5; ++step) {
          require(torch::equal(train(resumed, resumed_sgd, step), train(trained, trained_sgd, step)),
                  what + ": the resumed model's output at step " + std::to_string(step) + " differs");
        }
      }
    }
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
