// The example trainers on one GPU: with --cuda-graph on the whole step
// (micro-batches under no_sync, clipping, loss scaling, the optimizer) is
// recorded into a CUDA graph and replayed, and trains as the eager step does.
// train_resnet50 does so by default on a GPU (--cuda-graph auto). And on
// every GPU, a killed ResNet-50 run resumes exactly.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ddprun_runner.h"
#include "metrics_log.h"
#include "trainer_runs.h"

namespace {

using namespace ddp::launcher::testing;
using examples::testing::losses;

/// Whether the machine has an NVIDIA GPU, asked without initialising CUDA in
/// this process, which forks the launcher.
bool has_gpu() { return std::filesystem::exists("/dev/nvidia0"); }

/// Launches a trainer with one rank per GPU (examples::testing::LaunchTrainer).
DdprunResult on_every_gpu(const std::string& program, const std::vector<std::string>& args, const ScratchDir& scratch,
                          const std::vector<std::string>& launcher) {
  return examples::testing::run_trainer("gpu", {}, program, args, scratch, launcher);
}

/// The mean loss of steps [first, last].
double mean_loss(const std::map<int, double>& losses, int first, int last) {
  double sum = 0;
  for (int step = first; step <= last; ++step) sum += losses.at(step);
  return sum / (last - first + 1);
}

/// Runs `program` for `steps` steps with --cuda-graph off and then with
/// `captured_flags` on one GPU and returns each run's losses by step; the
/// captured run must say that it recorded its step.
std::vector<std::map<int, double>> eager_and_captured_losses(const std::string& program,
                                                             const std::vector<std::string>& args, int steps,
                                                             const std::vector<std::string>& captured_flags) {
  ScratchDir scratch;
  std::vector<std::map<int, double>> runs;
  for (const bool cuda_graph : {false, true}) {
    const std::string metrics = scratch.path() + (cuda_graph ? "/graph.jsonl" : "/eager.jsonl");
    std::vector<std::string> run_args = args;
    run_args.insert(run_args.end(), {"--steps", std::to_string(steps), "--log-every", "1", "--metrics", metrics});
    if (cuda_graph) {
      run_args.insert(run_args.end(), captured_flags.begin(), captured_flags.end());
    } else {
      run_args.insert(run_args.end(), {"--cuda-graph", "off"});
    }
    const auto result = examples::testing::run_trainer("1", {}, program, run_args, scratch);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    if (cuda_graph) {
      EXPECT_NE(result.output.find("recorded into a CUDA graph"), std::string::npos) << result.output;
    }
    runs.push_back(losses(metrics));
    EXPECT_EQ(runs.back().size(), static_cast<std::size_t>(steps)) << result.output;
  }
  return runs;
}

// LLaMA's kernels are deterministic here: every step's loss must agree.
TEST(ExamplesGpu, CapturedLlamaStepWithAccumulationAndClippingTrainsAsTheEagerOne) {
  if (!has_gpu()) GTEST_SKIP() << "needs a GPU";
  const int steps = 12;
  const auto runs =
      eager_and_captured_losses(TRAIN_LLAMA,
                                {"--preset", "tiny", "--precision", "bf16", "--batch", "8", "--warmup", "5", "--lr",
                                 "3e-3", "--grad-accum", "2", "--clip-grad-norm", "1.0", "--eval-batches", "1"},
                                steps, {"--cuda-graph", "on"});
  ASSERT_EQ(runs[0].size(), static_cast<std::size_t>(steps));
  ASSERT_EQ(runs[1].size(), static_cast<std::size_t>(steps));
  double worst = 0;
  for (const auto& [step, eager_loss] : runs[0]) {
    const double captured_loss = runs[1].at(step);
    ASSERT_TRUE(std::isfinite(captured_loss)) << "step " << step;
    worst = std::max(worst, std::abs(captured_loss - eager_loss) / std::abs(eager_loss));
  }
  std::printf("train_llama: captured vs eager, largest relative loss difference over %d steps: %.3g\n", steps, worst);
  EXPECT_LE(worst, 1e-3);
}

// fp16: the GradScaler's check, skip and scale update run inside the graph
// (its first steps overflow at the initial scale: the warm-up lasts until
// the optimizer has stepped). cuDNN's channels-last BatchNorm sums with
// atomics, so two eager runs already part after a few steps; the check is
// that the captured run trains as well: the mean loss of the last steps.
// The captured run gives no --cuda-graph: the default records on a GPU.
TEST(ExamplesGpu, CapturedResnetStepWithLossScalingTrainsAsTheEagerOne) {
  if (!has_gpu()) GTEST_SKIP() << "needs a GPU";
  const int steps = 16;
  const auto runs =
      eager_and_captured_losses(TRAIN_RESNET50,
                                {"--precision", "fp16", "--batch", "16", "--image-size", "64", "--classes", "10",
                                 "--warmup", "2", "--lr", "0.002", "--eval-batches", "1"},
                                steps, /*captured_flags=*/{});
  ASSERT_EQ(runs[0].size(), static_cast<std::size_t>(steps));
  ASSERT_EQ(runs[1].size(), static_cast<std::size_t>(steps));
  const double eager_first = mean_loss(runs[0], 1, 4), eager_last = mean_loss(runs[0], steps - 3, steps);
  const double captured_last = mean_loss(runs[1], steps - 3, steps);
  std::printf("train_resnet50: mean loss of steps 1-4 %.4f; of the last 4: eager %.4f, captured %.4f\n", eager_first,
              eager_last, captured_last);
  EXPECT_LT(captured_last, 0.95 * eager_first) << "the captured run's loss falls";
  EXPECT_NEAR(captured_last, eager_last, 0.1 * eager_last);
}

// cuDNN's autotuned convolutions make two ResNet-50 runs differ from the
// first steps on; with --deterministic a run killed on the last rank and
// restarted by ddprun from its checkpoint logs the uninterrupted run's losses.
// On every GPU of the machine (one rank per GPU), the captured step.
TEST(ExamplesGpu, AKilledDeterministicResnetRunResumesExactly) {
  if (!has_gpu()) GTEST_SKIP() << "needs a GPU";
  examples::testing::expect_exact_resume(
      on_every_gpu, TRAIN_RESNET50,
      {"--deterministic", "--precision", "bf16", "--batch", "16", "--image-size", "64", "--classes", "10", "--warmup",
       "2", "--lr", "0.002", "--eval-batches", "1", "--log-every", "1"},
      /*steps=*/8, /*fail_at=*/5, /*every=*/3);
}

// FP8 with delayed scaling: the amax histories and scales are part of the
// checkpoint in both formats (the whole one lost them on load, the sharded
// one never wrote them), so a killed run resumes with the scales it had,
// not with a fresh layer's.
TEST(ExamplesGpu, AKilledFp8LlamaRunResumesExactlyFromEitherCheckpointFormat) {
  if (!has_gpu()) GTEST_SKIP() << "needs a GPU";
  for (const char* format : {"whole", "sharded"}) {
    SCOPED_TRACE(std::string("--checkpoint-format ") + format);
    examples::testing::expect_exact_resume(
        on_every_gpu, TRAIN_LLAMA,
        {"--preset", "tiny", "--precision", "fp8", "--fp8-scaling", "delayed", "--batch", "8", "--warmup", "2", "--lr",
         "3e-3", "--eval-batches", "1", "--log-every", "1", "--checkpoint-format", format},
        /*steps=*/8, /*fail_at=*/5, /*every=*/3);
  }
}

}  // namespace
