// The example trainers as users run them: under ddprun, 2 Gloo ranks, small
// configurations. They train (the loss falls), a killed run resumes exactly
// where it stopped, and bad input is refused with a clear message.

#include <cmath>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ddprun_runner.h"
#include "images.h"
#include "metrics_log.h"
#include "trainer_runs.h"

namespace {

using namespace ddp::launcher::testing;
using examples::testing::losses;
using examples::testing::with;

double mean_of(const std::map<int, double>& values, int first, int last) {
  double sum = 0;
  for (int step = first; step <= last; ++step) sum += values.at(step);
  return sum / (last - first + 1);
}

DdprunResult train(const std::string& program, const std::vector<std::string>& args, const ScratchDir& scratch,
                   const std::vector<std::string>& launcher = {}) {
  return examples::testing::run_trainer("2", {{"DDP_BACKEND", "gloo"}}, program, args, scratch, launcher);
}

const std::vector<std::string> kResnet{"--precision", "fp32", "--batch", "8", "--image-size", "64", "--classes",
                                       "10", "--warmup", "2", "--lr", "0.002", "--label-smoothing", "0",
                                       "--eval-batches", "1", "--log-every", "1"};
const std::vector<std::string> kLlama{"--preset", "tiny", "--precision", "fp32", "--batch", "8", "--warmup", "5",
                                      "--lr", "3e-3", "--eval-batches", "2", "--log-every", "1"};

/// The exact-resume check (trainer_runs.h) on 2 Gloo ranks.
void expect_exact_resume(const std::string& program, const std::vector<std::string>& base, int steps, int fail_at,
                         int every, const std::string& note = "") {
  examples::testing::expect_exact_resume(train, program, base, steps, fail_at, every, note);
}

TEST(ResNet50Example, TrainsAndTheLossFalls) {
  ScratchDir scratch;
  const std::string metrics = scratch.path() + "/metrics.jsonl";
  const auto result = train(TRAIN_RESNET50, with(kResnet, {"--steps", "16", "--metrics", metrics}), scratch);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("validation top-1"), std::string::npos) << result.output;
  const auto loss = losses(metrics);
  ASSERT_EQ(loss.size(), 16u) << result.output;
  EXPECT_LT(mean_of(loss, 13, 16), 0.8 * mean_of(loss, 1, 4)) << result.output;
  // Fewer classes than top-5 takes (evaluation failed on topk), and a new
  // run's metrics log starts anew instead of following the last run's.
  const auto three = train(TRAIN_RESNET50,
                           with(kResnet, {"--classes", "3", "--steps", "1", "--warmup", "0", "--metrics", metrics}),
                           scratch);
  ASSERT_EQ(three.exit_code, 0) << three.output;
  EXPECT_NE(three.output.find("validation top-1"), std::string::npos) << three.output;
  EXPECT_EQ(losses(metrics).size(), 1u) << "the metrics log kept the earlier run's steps";
}

// 59 random 64 x 64 training images: 3 steps of 2 ranks x 8, then 11 left,
// which make step 4 for rank 0 alone (ddp::Join; BatchNorm's buffers come
// from rank 0 after it); the resumed run crosses that step.
TEST(ResNet50Example, AnEpochsUnevenTailIsTrainedUnderJoinAndResumesExactly) {
  ScratchDir data;
  data::write_class_names(data.path(), {"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"});  // top-5 needs 5+
  auto generator = at::detail::createCPUGenerator(7);
  for (const auto& [split, count] : std::vector<std::pair<std::string, int>>{{"train", 59}, {"val", 16}}) {
    data::ImageShardWriter writer(data.path(), split, 64, 64, 32);
    for (int i = 0; i < count; ++i) {
      const at::Tensor pixels = at::randint(0, 256, {64 * 64 * 3}, generator, at::kByte);
      writer.add(pixels.data_ptr<std::uint8_t>(), i % 10);
    }
    writer.finish();
  }
  expect_exact_resume(TRAIN_RESNET50, with(kResnet, {"--data", data.path(), "--uneven", "join", "--workers", "2"}), 6,
                      5, 3, "step 4: an epoch's uneven tail, trained by the ranks that have its data under ddp::Join");
}

// Sharded checkpoints: one file per rank and a manifest; BatchNorm's buffers
// travel in the manifest. With --sync-bn (statistics over both ranks' batches).
TEST(ResNet50Example, AKilledSyncBatchNormRunResumesExactlyFromAShardedCheckpoint) {
  expect_exact_resume(TRAIN_RESNET50, with(kResnet, {"--checkpoint-format", "sharded", "--sync-bn", "--deterministic"}),
                      6, 3, 2, "per rank, SyncBatchNorm");
}

TEST(LlamaExample, TrainsOnSyntheticTokens) {
  ScratchDir scratch;
  const std::string metrics = scratch.path() + "/metrics.jsonl";
  const auto result = train(TRAIN_LLAMA, with(kLlama, {"--steps", "60", "--metrics", metrics}), scratch);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto loss = losses(metrics);
  ASSERT_EQ(loss.size(), 60u);
  EXPECT_LT(mean_of(loss, 56, 60), 0.5 * std::log(256.0)) << result.output;
}

TEST(LlamaExample, LearnsARealTextWellBelowTheUniformGuess) {
  ScratchDir scratch;
  const std::string tokens = scratch.path() + "/text.bin", val = scratch.path() + "/val.bin";
  const auto made = run_ddprun({"--nproc-per-node", "1", "--standalone", MAKE_TOKENS, "--input", REAL_TEXT,
                                "--output", tokens, "--val-fraction", "0.1", "--val-output", val},
                               scratch);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const auto result = train(TRAIN_LLAMA,
                            with(kLlama, {"--steps", "150", "--data", tokens, "--val-data", val, "--log-every", "50",
                                          "--eval-batches", "4"}),
                            scratch);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::smatch match;
  ASSERT_TRUE(std::regex_search(result.output, match, std::regex(R"(validation loss ([0-9.]+))"))) << result.output;
  const double val_loss = std::stod(match[1]);
  EXPECT_LT(val_loss, 0.6 * std::log(256.0)) << "uniform guess " << std::log(256.0) << "\n" << result.output;
}

TEST(LlamaExample, AKilledRunWithAccumulationAndClippingResumesExactly) {
  expect_exact_resume(TRAIN_LLAMA, with(kLlama, {"--grad-accum", "2", "--clip-grad-norm", "1.0"}), 8, 5, 3);
}

// GPL-3 in windows of 256 tokens: 8 steps of 2 ranks x 8 rows, and 9 windows
// left, which make step 9 for rank 0 alone (ddp::Join); the resumed run
// crosses that step.
TEST(LlamaExample, AnEpochsUnevenTailIsTrainedUnderJoinAndResumesExactly) {
  ScratchDir data;
  const std::string tokens = data.path() + "/text.bin";
  const auto made = run_ddprun(
      {"--nproc-per-node", "1", "--standalone", MAKE_TOKENS, "--input", REAL_TEXT, "--output", tokens}, data);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  // ZeRO-3 with clipping: the rank without the tail's data meets the unit
  // gathers, the reduce-scatters and the clipping's norm, and steps its shard.
  expect_exact_resume(
      TRAIN_LLAMA,
      with(kLlama,
           {"--data", tokens, "--seq-len", "256", "--uneven", "join", "--sharding", "full", "--clip-grad-norm", "1.0"}),
      11, 5, 3, "step 9: an epoch's uneven tail, trained by the ranks that have its data under ddp::Join");
}

TEST(LlamaExample, AKilledZero3RunResumesExactly) {
  expect_exact_resume(TRAIN_LLAMA, with(kLlama, {"--sharding", "full", "--clip-grad-norm", "1.0"}), 6, 3, 2);
}

// ZeRO-1, 2 and 3 train the same model as plain DDP, step for step, with
// accumulation and clipping by the global norm; each prints its memory report.
TEST(LlamaExample, ShardedModesTrainAsPlainDdp) {
  ScratchDir scratch;
  const auto base = with(kLlama, {"--steps", "6", "--grad-accum", "2", "--clip-grad-norm", "0.5"});
  std::map<std::string, std::map<int, double>> by_mode;
  for (const std::string mode : {"none", "optimizer", "gradients", "full"}) {
    const std::string metrics = scratch.path() + "/" + mode + ".jsonl";
    const auto result = train(TRAIN_LLAMA, with(base, {"--sharding", mode, "--metrics", metrics}), scratch);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("memory per rank (sharding " + mode + ", 2 ranks)"), std::string::npos)
        << result.output;
    by_mode[mode] = losses(metrics);
    ASSERT_EQ(by_mode[mode].size(), 6u) << result.output;
  }
  for (const std::string mode : {"optimizer", "gradients", "full"}) {
    for (const auto& [step, loss] : by_mode["none"]) {
      EXPECT_NEAR(by_mode[mode].at(step), loss, 1e-5 * std::max(1.0, std::abs(loss))) << mode << ", step " << step;
    }
  }
}

TEST(Examples, BadInputIsRefusedByName) {
  ScratchDir scratch;
  struct Case {
    std::string program;
    std::vector<std::string> args;
    std::string expected;
  };
  const std::string checkpoint = scratch.path() + "/ckpt.pt";
  const std::string a_file = scratch.path() + "/a_file";
  std::ofstream(a_file) << "x";
  const std::vector<Case> cases{
      {TRAIN_LLAMA, {"--presett", "tiny"}, "unknown flag '--presett'"},
      {TRAIN_LLAMA, {"--preset", "gpt5"}, "tinyllama-1.1b"},
      {TRAIN_LLAMA, {"--precision", "fp64"}, "unknown precision 'fp64'"},
      {TRAIN_LLAMA, {"--precision", "fp16"}, "needs a CUDA device"},
      {TRAIN_LLAMA, {"--steps", "ten"}, "--steps expects an integer"},
      {TRAIN_LLAMA, {"--resume"}, "--resume needs --checkpoint"},
      {TRAIN_LLAMA, {"--sharding", "zero3"}, "unknown sharding mode 'zero3'; choose none"},
      {TRAIN_LLAMA, {"--checkpoint-format", "zip"}, "unknown --checkpoint-format 'zip'; choose whole or sharded"},
      {TRAIN_LLAMA, {"--lr", "nan"}, "train_llama: error: --lr must be a finite number > 0, got nan"},
      {TRAIN_LLAMA, {"--lr", "inf"}, "--lr must be a finite number > 0, got inf"},
      {TRAIN_RESNET50, {"--lr", "0"}, "--lr must be a finite number > 0, got 0"},
      {TRAIN_LLAMA, {"--min-lr", "-1"}, "--min-lr must be a finite number from 0 to --lr"},
      {TRAIN_LLAMA, {"--lr", "0.001", "--min-lr", "0.01"}, "--min-lr must be a finite number from 0 to --lr (0.001)"},
      {TRAIN_LLAMA, {"--data", scratch.path() + "/missing.bin"}, "missing.bin"},
      {TRAIN_RESNET50, {"--data", scratch.path() + "/no-such-dir"}, "no-such-dir"},
      {TRAIN_RESNET50, {"--precision", "fp8"}, "no FP8 path"},
      {TRAIN_RESNET50,
       {"--cuda-graph", "on"},
       "--cuda-graph on records the step into a CUDA graph, which needs a CUDA"},
      {TRAIN_RESNET50, {"--cuda-graph", "yes"}, "--cuda-graph must be on, off or auto, got 'yes'"},
      {TRAIN_LLAMA, {"--uneven", "join", "--cuda-graph", "on"}, "--uneven join trains the uneven steps eagerly"},
      {TRAIN_LLAMA, {"--uneven", "pad"}, "--uneven must be drop or join, got 'pad'"},
      {TRAIN_RESNET50, {"--bn", "fused"}, "--bn must be auto, cudnn, libddp or aten, got 'fused'"},
      // Checked before the first step, not found at the first save after training.
      {TRAIN_LLAMA, with(kLlama, {"--checkpoint", a_file + "/c.pt"}), "cannot create the folder " + a_file},
      {TRAIN_RESNET50, with(kResnet, {"--checkpoint", scratch.path()}), "is a folder; a whole checkpoint is one file"},
      {TRAIN_LLAMA, {"--weight-decay", "nan"}, "--weight-decay must be a finite number in [0, inf), got nan"},
      {TRAIN_LLAMA, {"--beta2", "1.5"}, "--beta2 must be a finite number in [0, 1), got 1.5"},
      {TRAIN_LLAMA, {"--eval-batches", "-3"}, "--eval-batches must be at least 0"},
      {TRAIN_RESNET50, {"--momentum", "-1"}, "--momentum must be a finite number in [0, 1), got -1"},
      {TRAIN_RESNET50, {"--label-smoothing", "-0.5"}, "--label-smoothing must be a finite number in [0, 1], got -0.5"},
  };
  for (const auto& c : cases) {
    const auto result = train(c.program, c.args, scratch);
    EXPECT_NE(result.exit_code, 0) << c.args[0];
    EXPECT_NE(result.output.find(c.expected), std::string::npos) << "expected '" << c.expected << "' in\n"
                                                                 << result.output;
    // One line, not LibTorch's C++ backtrace (--lr nan fails in ATen's check).
    EXPECT_EQ(result.output.find("Exception raised from"), std::string::npos) << "a backtrace in\n" << result.output;
  }
  // A checkpoint of another configuration is refused, naming both.
  const auto first = train(TRAIN_LLAMA, with(kLlama, {"--steps", "2", "--checkpoint", checkpoint}), scratch);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto other = train(TRAIN_LLAMA, with(kLlama, {"--steps", "4", "--batch", "4", "--checkpoint", checkpoint,
                                                      "--resume"}),
                           scratch);
  EXPECT_NE(other.exit_code, 0);
  EXPECT_NE(other.output.find("belongs to another run"), std::string::npos) << other.output;
  EXPECT_NE(other.output.find("batch=4x1"), std::string::npos) << other.output;
  // So is one whose LR schedule differs (it resumed with the new rate, silently).
  const auto other_lr =
      train(TRAIN_LLAMA, with(kLlama, {"--steps", "4", "--lr", "0.5", "--checkpoint", checkpoint, "--resume"}), scratch);
  EXPECT_NE(other_lr.exit_code, 0);
  EXPECT_NE(other_lr.output.find("lr=0.5 "), std::string::npos) << other_lr.output;
  // And one of the other format: before, it started afresh and failed at its first save.
  const auto other_format = train(
      TRAIN_LLAMA, with(kLlama, {"--steps", "4", "--checkpoint", checkpoint, "--checkpoint-format", "sharded",
                                 "--resume"}),
      scratch);
  EXPECT_NE(other_format.exit_code, 0);
  EXPECT_NE(other_format.output.find("holds a whole checkpoint (one file); resume it with --checkpoint-format whole"),
            std::string::npos)
      << other_format.output;
  EXPECT_EQ(other_format.output.find("step 1/"), std::string::npos) << "it trained: " << other_format.output;
}

// Ranks given different flags ran different collectives and ended in Gloo's "terminate called after throwing
// gloo::EnforceNotMet"; now every rank stops before its first step, naming the flag.
TEST(Examples, RanksGivenDifferentFlagsAreRefusedNamingTheFlag) {
  ScratchDir scratch;
  std::string command = std::string("exec ") + TRAIN_LLAMA;
  for (const std::string& arg : kLlama) command += " " + arg;
  const auto result = train("/bin/sh", {"-c", command + " --steps $((3 + RANK))"}, scratch);
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("--steps differs between ranks: rank(s) 1 were given another value than rank 0"),
            std::string::npos)
      << result.output;
  EXPECT_EQ(result.output.find("step 1/"), std::string::npos) << "it trained: " << result.output;
  EXPECT_EQ(result.output.find("terminate called"), std::string::npos) << result.output;
}

// --resume where only some ranks see the checkpoint (no shared filesystem): those ranks loaded it and the others
// started afresh, running different collectives. Now every rank stops first, saying how many saw it.
TEST(Examples, ACheckpointThatOnlySomeRanksSeeIsRefused) {
  ScratchDir scratch;
  const std::string checkpoint = scratch.path() + "/ckpt_1.pt";
  const auto first = train(TRAIN_LLAMA, with(kLlama, {"--steps", "2", "--checkpoint", checkpoint}), scratch);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  std::string command = std::string("exec ") + TRAIN_LLAMA;
  for (const std::string& arg : kLlama) command += " " + arg;
  command += " --steps 4 --resume --checkpoint " + scratch.path() + "/ckpt_$RANK.pt";
  const auto result = train("/bin/sh", {"-c", command}, scratch);
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("exists for 1 of 2 ranks (rank 0 does not see it)"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("resumed from"), std::string::npos) << result.output;
}

}  // namespace
