// ddp::CapturedStep on one GPU: a recorded and replayed DDP step trains as
// the eager one, and what cannot be recorded is a clear error.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "support/captured_scenarios.h"
#include "support/multiprocess.h"
#include "support/float8_gpu.h"

namespace {

using namespace ddp::testing;

std::shared_ptr<ddp::ProcessGroup> init_nccl() {
  return ddp::init(ddp::InitOptions().backend(ddp::Backend::kNccl).timeout(std::chrono::seconds(60)));
}

/// The message of the UsageError `run` throws; empty if none.
template <typename Run>
std::string usage_error_of(Run&& run) {
  try {
    run();
  } catch (const ddp::UsageError& e) {
    return e.what();
  }
  return "";
}

/// The scenario on one GPU, in a rank process of its own (NCCL's world of
/// one; one per test, as a rank process runs its test's first run_ranks()
/// body), where the scalers' scales and AdamW's step counts must agree too
/// and match `expected_scale` and `expected_adamw_steps`.
void expect_captured_matches_eager(const CapturedScenario& scenario, const char* name, double expected_scale = 1,
                                   std::int64_t expected_adamw_steps = 8) {
  expect_all_succeeded(run_ranks(1, [&](int) {
    const CapturedComparison result = check_captured_step_matches_eager(init_nccl(), scenario);
    std::printf("captured vs eager, 1 GPU, %s: largest difference %.3g, scales %g / %g, AdamW steps %lld / %lld\n",
                name, result.difference, result.eager_scale, result.captured_scale,
                static_cast<long long>(result.eager_adamw_steps), static_cast<long long>(result.captured_adamw_steps));
    if (result.eager_scale != expected_scale || result.captured_scale != expected_scale) {
      throw std::runtime_error("a scaler's scale is not " + std::to_string(expected_scale));
    }
    if (result.eager_adamw_steps != expected_adamw_steps || result.captured_adamw_steps != expected_adamw_steps) {
      throw std::runtime_error("AdamW's step count is not " + std::to_string(expected_adamw_steps));
    }
  }));
}

TEST(CapturedStep, ReplaysTrainAsTheEagerStepOnOneGpu) { expect_captured_matches_eager(CapturedScenario(), "fp32"); }

// The infs of steps 0 and 1 skip both warm-up steps (the warm-up lasts until
// the optimizer has state: step 2 runs eagerly too); step 5's inf is found
// in a replay, on the device. Each backs the scale off, and none counts an
// AdamW step.
TEST(CapturedStep, GradScalerSkipsInfStepsInsideTheGraph) {
  expect_captured_matches_eager(CapturedScenario().grad_scaler(true).inf_steps({0, 1, 5}), "fp16 + GradScaler",
                                65536.0 / 8, 8 - 3);
}

TEST(CapturedStep, NoSyncMicroBatchesAreRecordedInOneGraph) {
  expect_captured_matches_eager(CapturedScenario().micro_batches(3), "3 micro-batches");
}

TEST(CapturedStep, Float8DelayedScalingInsideTheGraph) {
  DDP_SKIP_WITHOUT_FLOAT8();
  expect_captured_matches_eager(CapturedScenario().float8(true), "fp8 delayed scaling");
}

// A step the GradScaler skips inside the graph still writes the FP8 casts
// of the weights (as they stay) that the next replay's forward reads.
TEST(CapturedStep, Float8WithGradScalerSkippingAStepInsideTheGraph) {
  DDP_SKIP_WITHOUT_FLOAT8();
  expect_captured_matches_eager(CapturedScenario().float8(true).grad_scaler(true).inf_steps({5}),
                                "fp8 delayed scaling + GradScaler", 65536.0 / 2, 8 - 1);
}

TEST(CapturedStep, ShardedOptimizerInsideTheGraph) {
  expect_captured_matches_eager(CapturedScenario().sharding(ddp::Sharding::kOptimizer), "ZeRO-1");
}

TEST(CapturedStep, ShardedGradientsWithGradScalerInsideTheGraph) {
  expect_captured_matches_eager(CapturedScenario().sharding(ddp::Sharding::kGradients).grad_scaler(true).inf_steps({4}),
                                "ZeRO-2 + GradScaler", 65536.0 / 2, 8 - 1);
}

// On one rank kFull keeps its units whole (FSDP's NO_SHARD); the gathers
// and frees inside the graph are tested on two GPUs.
TEST(CapturedStep, FullyShardedUnitsInsideTheGraph) {
  expect_captured_matches_eager(CapturedScenario().sharding(ddp::Sharding::kFull), "ZeRO-3");
}

// param_dtype makes the units transient on one rank too: each is gathered
// (cast to bf16) into fresh memory and freed inside the graph.
TEST(CapturedStep, FullyShardedUnitsGatheredInBf16InsideTheGraph) {
  expect_captured_matches_eager(CapturedScenario().sharding(ddp::Sharding::kFull).param_dtype(at::kBFloat16),
                                "ZeRO-3, param_dtype bf16");
}

// ZeRO-2 with resident bf16 units: each step casts the fp32 masters into
// them inside the graph; the first micro-batch accumulates under no_sync.
TEST(CapturedStep, ShardedGradientsWithBf16UnitsAndNoSyncInsideTheGraph) {
  expect_captured_matches_eager(
      CapturedScenario().sharding(ddp::Sharding::kGradients).param_dtype(at::kBFloat16).micro_batches(2),
      "ZeRO-2, param_dtype bf16, no_sync");
}

TEST(CapturedStep, UnusedLayerUnderStaticGraphInsideTheGraph) {
  expect_captured_matches_eager(CapturedScenario().unused_layer(true), "find_unused_parameters + static_graph");
}

TEST(CapturedStep, ShapeChangesAndHostSyncsAreUsageErrors) {
  const torch::Device gpu(torch::kCUDA, 0);
  torch::nn::Linear model(8, 8);
  model->to(gpu);
  ddp::optim::FusedSGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  ddp::CapturedStep step(
      optimizer,
      [&](const std::vector<at::Tensor>& batch) {
        optimizer.zero_grad(/*set_to_none=*/false);
        at::Tensor loss = model(batch[0]).square().mean();
        loss.backward();
        optimizer.step();
        return loss;
      },
      ddp::CapturedStepOptions().warmup_steps(1));
  step({torch::randn({4, 8}, gpu)});
  step({torch::randn({4, 8}, gpu)});
  ASSERT_TRUE(step.captured());
  const std::string shape = usage_error_of([&] { step({torch::randn({6, 8}, gpu)}); });
  EXPECT_NE(shape.find("call reset()"), std::string::npos) << shape;
  const std::string host = usage_error_of([&] { step({torch::randn({4, 8})}); });
  EXPECT_NE(host.find("move the batch to the GPU"), std::string::npos) << host;
  // Recorded anew for the new shape.
  step.reset();
  step({torch::randn({6, 8}, gpu)});
  step({torch::randn({6, 8}, gpu)});
  EXPECT_TRUE(step.captured());

  // A step that reads a value on the host cannot be recorded.
  ddp::CapturedStep syncing(
      optimizer,
      [&](const std::vector<at::Tensor>& batch) {
        optimizer.zero_grad(/*set_to_none=*/false);
        at::Tensor loss = model(batch[0]).square().mean();
        if (loss.item<float>() < 0) loss = -loss;
        loss.backward();
        optimizer.step();
        return loss;
      },
      ddp::CapturedStepOptions().warmup_steps(1));
  syncing({torch::randn({4, 8}, gpu)});
  const std::string sync = usage_error_of([&] { syncing({torch::randn({4, 8}, gpu)}); });
  EXPECT_NE(sync.find("could not be recorded into a CUDA graph"), std::string::npos) << sync;
  EXPECT_FALSE(syncing.captured());
}

// The recording's allocations come from a pool of their own, and during a
// capture the caching allocator releases no cached block: with the process
// capped at what the eager steps reserved plus half of their scratch tensor,
// the recording fits only if the eager steps' cached scratch was released
// before it.
TEST(CapturedStep, RecordingReleasesTheEagerStepsCachedMemory) {
  namespace allocator = c10::cuda::CUDACachingAllocator;
  const torch::Device gpu(torch::kCUDA, 0);
  torch::nn::Linear model(64, 64);
  model->to(gpu);
  ddp::optim::FusedSGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  constexpr std::int64_t kScratchBytes = std::int64_t{1} << 30;
  ddp::CapturedStep step(
      optimizer,
      [&](const std::vector<at::Tensor>& batch) {
        optimizer.zero_grad(/*set_to_none=*/false);
        // An activation-sized temporary, freed (to the cache) when the step ends.
        const at::Tensor scratch = torch::ones({kScratchBytes / 4}, torch::TensorOptions(gpu));
        at::Tensor loss = model(batch[0]).square().mean() + scratch.narrow(0, 0, 1).sum();
        loss.backward();
        optimizer.step();
        return loss;
      },
      ddp::CapturedStepOptions().warmup_steps(2));
  const at::Tensor batch = torch::randn({16, 64}, gpu);
  step({batch});
  step({batch});
  ASSERT_FALSE(step.captured());
  const auto reserved = allocator::getDeviceStats(gpu.index()).reserved_bytes[0].current;
  std::size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  allocator::setMemoryFraction(static_cast<double>(reserved + kScratchBytes / 2) / static_cast<double>(total_bytes),
                               gpu.index());
  std::string error;
  try {
    step({batch});
  } catch (const ddp::UsageError& e) {
    error = e.what();
  }
  allocator::setMemoryFraction(1.0, gpu.index());
  EXPECT_EQ(error, "");
  EXPECT_TRUE(step.captured());
}

// A recording that fails as it ends (here: work forked onto another stream
// and never joined, which cudaStreamEndCapture refuses) is the same one-line
// UsageError as one that fails inside the step, and leaves nothing recorded:
// the next call records anew. (capture_end() was outside the try: a raw
// c10::Error, and captured() said true with a broken graph.)
TEST(CapturedStep, ARecordingThatFailsAsItEndsIsAUsageErrorAndRecordsAgain) {
  const torch::Device gpu(torch::kCUDA, 0);
  torch::nn::Linear model(8, 8);
  model->to(gpu);
  ddp::optim::FusedSGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  bool leave_a_fork = true;
  int calls = 0;
  ddp::CapturedStep step(
      optimizer,
      [&](const std::vector<at::Tensor>& batch) {
        optimizer.zero_grad(/*set_to_none=*/false);
        at::Tensor loss = model(batch[0]).square().mean();
        loss.backward();
        optimizer.step();
        if (++calls == 3 && leave_a_fork) {  // the recording
          const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, gpu.index());
          at::cuda::CUDAEvent forked;
          forked.record(c10::cuda::getCurrentCUDAStream(gpu.index()));
          forked.block(side);
          const c10::cuda::CUDAStreamGuard on_side(side);
          loss.add(1);
        }
        return loss;
      },
      ddp::CapturedStepOptions().warmup_steps(2));
  const at::Tensor batch = torch::randn({4, 8}, gpu);
  step({batch});
  step({batch});
  std::string error;
  try {
    step({batch});
  } catch (const ddp::UsageError& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("the step could not be recorded into a CUDA graph"), std::string::npos) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  EXPECT_FALSE(step.captured());
  leave_a_fork = false;
  step({batch});
  EXPECT_TRUE(step.captured());
}

}  // namespace
