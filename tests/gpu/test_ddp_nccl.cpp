// DistributedDataParallel over NCCL on 2 GPUs: the same equivalence with
// single-process training as over Gloo. Exits with 77 (skipped) without 2 GPUs.

#include <cstdio>
#include <stdexcept>
#include <string>
#include <fstream>
#include <iterator>
#include <optional>

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "support/captured_scenarios.h"
#include "support/join_scenarios.h"
#include "support/sparse_scenarios.h"
#include "support/sync_batch_norm_scenarios.h"
#include "support/ddp_scenarios.h"
#include "support/sharding_scenarios.h"
#include "support/multiprocess.h"
#include "support/nccl_collective_log.h"
#include "support/float8_gpu.h"

namespace {

using namespace ddp::testing;

/// Copy-engine reductions unset: DDP_COPY_ENGINE_REDUCTIONS=1 runs every test here over them.
std::shared_ptr<ddp::ProcessGroup> init_nccl(std::optional<bool> copy_engine_reductions = std::nullopt) {
  return ddp::init(ddp::InitOptions()
                       .backend(ddp::Backend::kNccl)
                       .timeout(std::chrono::seconds(60))
                       .copy_engine_reductions(copy_engine_reductions));
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

// Buckets of megabytes, so that the copy engines carry them, with and
// without no_sync.
TEST(DdpNccl, CopyEngineReductionsMatchSingleProcess) {
  expect_all_succeeded(run_ranks(2, [](int) {
    auto pg = init_nccl(/*copy_engine_reductions=*/true);
    Scenario wide;
    wide.width = 1 << 15;  // a 2 MiB trunk and a 512 KiB head
    wide.tolerance = 1e-4;
    check_matches_single_process(*pg, wide);
    wide.micro_steps = 2;
    check_matches_single_process(*pg, wide);
  }));
}

// The sharded modes' reduce-scatters and all-gathers on the copy engines
// (megabyte buckets and units), against plain DDP and one process. NCCL's
// log of the same run without them is the control: it must show large
// collectives, and with them on, none may reach NCCL.
void check_sharded_modes_on_nccl(bool copy_engine_reductions) {
  expect_all_succeeded(run_ranks(
      2,
      [copy_engine_reductions](int) {
        auto pg = init_nccl(copy_engine_reductions);
        for (ddp::Sharding sharding : {ddp::Sharding::kOptimizer, ddp::Sharding::kGradients, ddp::Sharding::kFull}) {
          ShardingScenario scenario;
          scenario.sharding = sharding;
          scenario.fused_optimizer = true;
          scenario.width = 32769;               // a 2 MiB trunk, a 512 KiB head, counts divisible by no world size
          scenario.reference_tolerance = 1e-3;  // as over NCCL, below
          check_sharded_matches(*pg, scenario);
        }
        const NcclLoggedCollectives logged = nccl_logged_collectives();
        if (copy_engine_reductions) {
          // The small ones still reach NCCL: an empty log would be no evidence.
          require(logged.count > 0, "NCCL's log of collectives is empty: it cannot show what went to the copy engines");
          require(logged.large == 0, std::to_string(logged.large) + " collectives of 512 KiB or more reached NCCL");
        } else {
          require(logged.large_reduce_scatters > 0 && logged.large_all_gathers > 0,
                  "the sharded modes issued no reduce-scatter or no all-gather of 512 KiB or more: the scenario "
                  "cannot show the copy engines carrying them");
        }
      },
      nccl_logging_collectives()));
}

TEST(DdpNccl, ShardedModesOnTheCopyEnginesMatchPlainDdpAndOneProcess) {
  check_sharded_modes_on_nccl(/*copy_engine_reductions=*/false);
  check_sharded_modes_on_nccl(/*copy_engine_reductions=*/true);
}

// ZeRO-1 and ZeRO-2 over NCCL's reduce-scatter and in-place all-gather, with
// the fused AdamW kernel on the shards: the Gloo suite's equivalences.
TEST(DdpNccl, ShardedModesMatchPlainDdpAndOneProcess) {
  expect_all_succeeded(run_ranks(2, [](int) {
    auto pg = init_nccl();
    for (ddp::Sharding sharding : {ddp::Sharding::kOptimizer, ddp::Sharding::kGradients, ddp::Sharding::kFull}) {
      ShardingScenario scenario;
      scenario.sharding = sharding;
      scenario.fused_optimizer = true;
      // Each mode against plain DDP stays at 1e-6; the one process on the
      // whole batch sums its GEMMs in another order on the GPU, and AdamW turns
      // such roundings of near-zero gradient elements into steps of up to lr
      // (2 GPUs, 2026-11-25: clipping norms 5.6e-5 apart).
      scenario.reference_tolerance = 1e-3;
      check_sharded_matches(*pg, scenario);
      scenario.options.bucket_cap_mb(0.001).first_bucket_cap_mb(0.0005);
      check_sharded_matches(*pg, scenario);
      scenario.model = ShardedModel::kBranchy;
      scenario.options.find_unused_parameters(true);
      scenario.micro_steps = 2;
      scenario.clip = 0.05;
      check_sharded_matches(*pg, scenario);
      scenario.model = ShardedModel::kTied;
      scenario.options.find_unused_parameters(false);
      check_sharded_matches(*pg, scenario);
      scenario.options.comm_hook(ddp::comm_hooks::average_in(torch::kBFloat16));
      scenario.tolerance = 1e-3;
      scenario.reference_tolerance = 0.1;
      check_sharded_matches(*pg, scenario);
    }
    check_memory_report(*pg);
    check_grad_scaler_agrees(*pg, ddp::Sharding::kFull);
    check_units_gather_one_at_a_time(*pg);
    UnitGathering bf16;  // FSDP's param_dtype (DeepSpeed's bf16 mode in ZeRO-1/2): units in bf16, fp32 masters
    bf16.param_dtype = at::kBFloat16;
    bf16.tolerance = 2e-5;
    for (const auto sharding : {ddp::Sharding::kFull, ddp::Sharding::kGradients, ddp::Sharding::kOptimizer}) {
      bf16.sharding = sharding;
      check_units_gather_one_at_a_time(*pg, bf16);
    }
  }));
}

// shift's gradient is a view of the output gradient that the head's backward
// still reads (LibTorch 2.x): it must be copied into its bucket, not reduced
// in place while the head's kernels read it.
TEST(DdpNccl, ParameterUsedThroughAViewMatchesSingleProcess) {
  expect_all_succeeded(run_ranks(2, [](int) {
    auto pg = init_nccl();
    Scenario scenario;
    scenario.model = Model::kViewedParameter;
    scenario.options.bucket_cap_mb(1e-6).first_bucket_cap_mb(1e-6);
    check_matches_single_process(*pg, scenario);
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

// Sparse embedding gradients over NCCL: indices and values all-gathered, then
// coalesced and averaged, equal to one process (the Gloo suite's checks).
TEST(DdpNccl, SparseGradientsMatchOneProcess) {
  expect_all_succeeded(run_ranks(2, [](int) {
    auto pg = init_nccl();
    ddp::testing::check_sparse_matches_one_process(pg, /*rare_on_rank0_only=*/false, /*accumulate=*/false);
  }));
}

TEST(DdpNccl, SparseGradientsOfAnEmbeddingOneRankUsesAndUnderNoSyncMatchOneProcess) {
  expect_all_succeeded(run_ranks(2, [](int) {
    auto pg = init_nccl();
    ddp::testing::check_sparse_matches_one_process(pg, /*rare_on_rank0_only=*/true, /*accumulate=*/true);
  }));
}

// ddp::Join over NCCL: the Gloo suite's uneven-input checks.
TEST(DdpNccl, JoinWithUnevenBatchesMatchesOneProcess) {
  expect_all_succeeded(run_ranks(2, [](int) {
    ddp::testing::JoinScenario s{{2, 5}};
    s.micro_batches = 2;
    s.side_branch = true;
    s.batch_norm = true;
    s.grad_scaler = true;
    ddp::testing::check_join_matches_one_process(init_nccl(), s);
  }));
}

TEST(DdpNccl, JoinAveragedOverTheActiveRanksThenTrainingOnMatchesOneProcess) {
  expect_all_succeeded(run_ranks(2, [](int) {
    ddp::testing::JoinScenario s{{4, 1}};
    s.divide_by_initial_world_size = false;
    s.steps_after_join = 2;  // the momentum comes over from rank 0
    ddp::testing::check_join_matches_one_process(init_nccl(), s);
  }));
}

// kFull over NCCL: the joined rank repeats its unit gathers (on the
// communicator's stream, released as the current stream goes on) and reductions.
TEST(DdpNccl, JoinWithFullShardingAndEvaluationForwardsMatchesOneProcess) {
  expect_all_succeeded(run_ranks(2, [](int) {
    ddp::testing::JoinScenario s{{2, 5}};
    s.sharding = ddp::Sharding::kFull;
    s.batch_norm = true;
    s.evaluate_each_step = true;
    s.grad_scaler = true;
    s.steps_after_join = 1;
    ddp::testing::check_join_matches_one_process(init_nccl(), s);
  }));
}

TEST(DdpNccl, JoinWithGradientShardingMatchesOneProcess) {
  expect_all_succeeded(run_ranks(2, [](int) {
    ddp::testing::JoinScenario s{{4, 1}};
    s.sharding = ddp::Sharding::kGradients;
    s.micro_batches = 2;
    s.divide_by_initial_world_size = false;
    s.steps_after_join = 1;
    ddp::testing::check_join_matches_one_process(init_nccl(), s);
  }));
}

// SyncBatchNorm over NCCL: the Gloo suite's checks (different and empty batches, and under DDP).
TEST(DdpNccl, SyncBatchNormMatchesOneProcess) {
  expect_all_succeeded(run_ranks(2, [](int) {
    auto pg = init_nccl();
    ddp::testing::check_sync_batch_norm_matches_one_process(pg, {3, 0});
    ddp::testing::check_sync_batch_norm_under_ddp_matches_one_process(pg);
  }));
}

TEST(DdpNccl, MisuseIsReported) {
  expect_all_succeeded(run_ranks(2, [](int) {
    auto pg = init_nccl();
    check_model_mismatch_is_reported(*pg);
    check_unused_parameter_is_reported(*pg);
  }));
}

// Delayed FP8 scaling: after all_reduce_amaxes every rank holds the largest
// amax of any rank, and then casts alike: the same input gives the same
// output on both ranks although each rank saw different values before.
TEST(DdpNccl, Float8AmaxesAgreeAcrossRanks) {
  DDP_SKIP_WITHOUT_FLOAT8();
  expect_all_succeeded(run_ranks(2, [](int rank) {
    auto pg = init_nccl();
    torch::manual_seed(0);  // the same weights on both ranks
    ddp::Float8Linear layer(torch::nn::LinearOptions(64, 32).bias(false),
                            ddp::Float8Options().scaling(ddp::Float8Scaling::kDelayed).amax_history_len(4));
    layer->to(pg->device());
    const auto bf16 = torch::TensorOptions().device(pg->device()).dtype(torch::kBFloat16);
    // Amaxes 2 and 3 (input), 5 and 6 (output gradient): not a power of two
    // apart, so the two ranks' own scales would round the probe differently.
    const auto input = torch::full({16, 64}, 2.0 + rank, bf16).requires_grad_();
    layer(input).backward(torch::full({16, 32}, 5.0 + rank, bf16));
    ddp::float8::all_reduce_amaxes(*layer, *pg);

    const auto amaxes = layer->latest_amaxes();
    require(amaxes.size() == 3, "expected the input, weight and output-gradient amaxes");
    require(amaxes[0].item<float>() == 3.0f, "input amax " + std::to_string(amaxes[0].item<float>()) + ", expected 3");
    require(amaxes[1].item<float>() == layer->weight.abs().max().item<float>(), "weight amax changed");
    require(amaxes[2].item<float>() == 6.0f,
            "output-gradient amax " + std::to_string(amaxes[2].item<float>()) + ", expected 6");

    torch::manual_seed(1);  // the same probe on both ranks
    const auto probe = torch::randn({16, 64}, bf16);
    const auto output = [&] {
      torch::NoGradGuard no_grad;
      return layer(probe).to(torch::kFloat);
    }();
    auto highest = output.clone(), negated_lowest = -output;
    pg->communicator().all_reduce(highest, ddp::ReduceOp::kMax)->wait();
    pg->communicator().all_reduce(negated_lowest, ddp::ReduceOp::kMax)->wait();
    require(torch::equal(highest, output) && torch::equal(-negated_lowest, output),
            "the ranks cast the same probe differently after agreeing on their amaxes");
  }));
}

TEST(DdpNccl, TimelineRecordsEveryBucketReductionAndWritesATrace) {
  expect_all_succeeded(run_ranks(2, [](int rank) {
    auto pg = init_nccl();
    const std::string path = "ddp_timeline_test.rank" + std::to_string(rank) + ".json";
    std::size_t buckets = 0;
    {
      torch::manual_seed(0);
      auto model = torch::nn::Sequential(torch::nn::Linear(1024, 1024), torch::nn::ReLU(), torch::nn::Linear(1024, 1024),
                                         torch::nn::ReLU(), torch::nn::Linear(1024, 10));
      model->to(pg->device());
      ddp::DistributedDataParallel<torch::nn::Sequential> ddp_model(
          model, pg, ddp::DistributedDataParallelOptions().bucket_cap_mb(2).first_bucket_cap_mb(1).timeline_path(path));
      const auto input = torch::randn({256, 1024}, torch::TensorOptions().device(pg->device()));
      for (int step = 0; step < 3; ++step) {
        model->zero_grad();
        ddp_model(input).sum().backward();
      }
      { ddp_model(input).sum(); }  // a forward without backward records nothing
      const auto timings = ddp_model.timings();
      buckets = ddp_model.bucket_count();
      require(timings.size() == 3, "recorded " + std::to_string(timings.size()) + " iterations, expected 3");
      for (const auto& t : timings) {
        require(t.backward_ms > 0 && t.communication_ms > 0, "empty timing");
        require(t.exposed_communication_ms >= 0 && t.exposed_communication_ms <= t.communication_ms + 1e-3,
                "exposed " + std::to_string(t.exposed_communication_ms) + " ms exceeds communication " +
                    std::to_string(t.communication_ms) + " ms");
      }
    }  // the trace is written when the DDP object goes
    std::ifstream file(path);
    const std::string trace((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    require(trace.find("\"traceEvents\"") != std::string::npos, "no trace written to " + path);
    for (std::size_t b = 0; b < buckets; ++b) {
      require(trace.find("bucket " + std::to_string(b) + " all_reduce") != std::string::npos,
              "bucket " + std::to_string(b) + " missing from the trace");
    }
    std::remove(path.c_str());
  }));
}

// The documented hook shape lets a hook's finish keep and use the
// communicator it was given. Under the timeline that communicator is an
// observer, which must live until the finish has run (it was destroyed at
// the end of the launch loop, leaving the finish a dangling reference).
TEST(DdpNccl, AHookWhoseFinishUsesItsCommunicatorWorksUnderTheTimeline) {
  expect_all_succeeded(run_ranks(2, [](int rank) {
    auto pg = init_nccl();
    const auto late_average = [](ddp::Communicator& comm, const ddp::GradBucket& bucket) {
      return std::function<void()>([&comm, buffer = bucket.buffer]() mutable {
        buffer.div_(comm.world_size());
        comm.all_reduce(buffer)->wait();
      });
    };
    std::vector<at::Tensor> gradients[2];
    for (int variant = 0; variant < 2; ++variant) {
      torch::manual_seed(0);
      auto model = torch::nn::Sequential(torch::nn::Linear(1024, 1024), torch::nn::ReLU(),
                                         torch::nn::Linear(1024, 1024), torch::nn::ReLU(), torch::nn::Linear(1024, 10));
      model->to(pg->device());
      auto options = ddp::DistributedDataParallelOptions().bucket_cap_mb(2).first_bucket_cap_mb(1);
      if (variant == 1) options.record_timeline(true).comm_hook(late_average);
      ddp::DistributedDataParallel<torch::nn::Sequential> ddp_model(model, pg, options);
      torch::manual_seed(100 + rank);
      const auto input = torch::randn({32, 1024}, torch::TensorOptions().device(pg->device()));
      for (int step = 0; step < 3; ++step) {
        model->zero_grad();
        ddp_model(input).square().sum().backward();
      }
      for (const auto& p : model->parameters()) gradients[variant].push_back(p.grad().clone());
      if (variant == 1) {
        require(ddp_model.bucket_count() > 1,
                "the test needs several buckets, has " + std::to_string(ddp_model.bucket_count()));
      }
    }
    for (std::size_t i = 0; i < gradients[0].size(); ++i) {
      require(torch::allclose(gradients[0][i], gradients[1][i], 1e-5, 1e-6),
              "parameter " + std::to_string(i) + ": the hook's late average differs from DDP's");
    }
  }));
}

// Two ranks: the bucket reductions are recorded into the graph (NCCL inside
// the capture, the comm stream joining it) and each replay is watched as one
// collective; the replays must train as the eager steps do.
void expect_captured_matches_eager_on_two_gpus(const ddp::testing::CapturedScenario& scenario, const char* name,
                                               std::optional<bool> copy_engine_reductions = std::nullopt) {
  expect_all_succeeded(run_ranks(2, [&](int rank) {
    auto pg = init_nccl(copy_engine_reductions);
    const auto result = ddp::testing::check_captured_step_matches_eager(pg, scenario);
    if (rank == 0) {
      std::printf("captured vs eager, 2 GPUs, %s: largest difference %.3g, scales %g / %g\n", name, result.difference,
                  result.eager_scale, result.captured_scale);
    }
    if (result.eager_scale != result.captured_scale || result.eager_adamw_steps != result.captured_adamw_steps) {
      throw std::runtime_error("the scalers' scales or AdamW's step counts differ");
    }
  }));
}

TEST(DdpNccl, CapturedStepWithBucketReductionsInTheGraphMatchesEager) {
  expect_captured_matches_eager_on_two_gpus({}, "fp32");
}

// Gradients of 1 MiB and 512 KiB: the copy engines' copies and flags are
// recorded into the graph and must work at every replay, with no_sync too.
TEST(DdpNccl, CapturedStepWithCopyEngineReductionsInTheGraphMatchesEager) {
  expect_captured_matches_eager_on_two_gpus(ddp::testing::CapturedScenario().hidden(8192), "fp32, copy engines",
                                            /*copy_engine_reductions=*/true);
  expect_captured_matches_eager_on_two_gpus(ddp::testing::CapturedScenario().hidden(8192).micro_batches(2),
                                            "fp32, copy engines, no_sync", /*copy_engine_reductions=*/true);
}

// The inf is in rank 1's batch only: the ranks agree on skipping inside the
// graph (found_inf max-reduced on the device).
TEST(DdpNccl, CapturedStepWithGradScalerAndNoSyncMatchesEager) {
  expect_captured_matches_eager_on_two_gpus(
      ddp::testing::CapturedScenario().grad_scaler(true).inf_steps({0, 1, 5}).inf_rank(1).micro_batches(2),
      "fp16 + GradScaler, 2 micro-batches");
}

// Across ranks DDP rebuilds its buckets in its second iteration: recording
// that one is refused by name.
TEST(DdpNccl, RecordingTheBucketRebuildIsAUsageError) {
  expect_all_succeeded(run_ranks(2, [](int) {
    try {
      ddp::testing::check_captured_step_matches_eager(init_nccl(), ddp::testing::CapturedScenario().warmup_steps(1));
    } catch (const ddp::UsageError& e) {
      if (std::string(e.what()).find("warmup_steps(2)") != std::string::npos) return;
      throw;
    }
    throw std::runtime_error("a recording of the bucket rebuild was not refused");
  }));
}

TEST(DdpNccl, CapturedStepWithFloat8DelayedScalingMatchesEager) {
  DDP_SKIP_WITHOUT_FLOAT8();
  expect_captured_matches_eager_on_two_gpus(ddp::testing::CapturedScenario().float8(true), "fp8 delayed scaling");
}

TEST(DdpNccl, CapturedStepWithShardedOptimizerMatchesEager) {
  expect_captured_matches_eager_on_two_gpus(ddp::testing::CapturedScenario().sharding(ddp::Sharding::kOptimizer),
                                            "ZeRO-1");
}

// Each unit is all-gathered into fresh memory and freed around its forward
// and its backward, inside the graph.
TEST(DdpNccl, CapturedStepWithFullyShardedUnitsMatchesEager) {
  expect_captured_matches_eager_on_two_gpus(ddp::testing::CapturedScenario().sharding(ddp::Sharding::kFull), "ZeRO-3");
}

TEST(DdpNccl, CapturedStepWithFullyShardedUnitsInBf16MatchesEager) {
  expect_captured_matches_eager_on_two_gpus(
      ddp::testing::CapturedScenario().sharding(ddp::Sharding::kFull).param_dtype(at::kBFloat16),
      "ZeRO-3, param_dtype bf16");
}

// The cast of each master into its part, then the all-gather, inside the graph.
TEST(DdpNccl, CapturedStepWithBf16UnitsInZeroTwoMatchesEager) {
  expect_captured_matches_eager_on_two_gpus(
      ddp::testing::CapturedScenario().sharding(ddp::Sharding::kGradients).param_dtype(at::kBFloat16).micro_batches(2),
      "ZeRO-2, param_dtype bf16, no_sync");
}

// The unused layer's gradients are never reduced: static_graph knows so
// after the first step, and the recording skips them.
TEST(DdpNccl, CapturedStepWithAnUnusedLayerUnderStaticGraphMatchesEager) {
  expect_captured_matches_eager_on_two_gpus(ddp::testing::CapturedScenario().unused_layer(true),
                                            "find_unused_parameters + static_graph");
}

TEST(DdpNccl, CapturedStepWithShardedGradientsMatchesEager) {
  expect_captured_matches_eager_on_two_gpus(ddp::testing::CapturedScenario().sharding(ddp::Sharding::kGradients),
                                            "ZeRO-2");
}

}  // namespace
