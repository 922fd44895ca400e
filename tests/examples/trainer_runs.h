#pragma once

// The example trainers run as users run them, under ddprun; and the check
// that a run killed by --fail-at-step and restarted by ddprun from its last
// checkpoint logs every step's loss as the uninterrupted run does.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ddprun_runner.h"
#include "metrics_log.h"

namespace examples::testing {

/// ddprun --nproc-per-node `nproc` --standalone LAUNCHER... PROGRAM ARGS...
/// with the environment changed by `env`; what ddprun returned.
inline ddp::launcher::testing::DdprunResult run_trainer(const std::string& nproc,
                                                        const ddp::launcher::testing::EnvChanges& env,
                                                        const std::string& program,
                                                        const std::vector<std::string>& args,
                                                        const ddp::launcher::testing::ScratchDir& scratch,
                                                        const std::vector<std::string>& launcher = {}) {
  std::vector<std::string> command{"--nproc-per-node", nproc, "--standalone"};
  command.insert(command.end(), launcher.begin(), launcher.end());
  command.push_back(program);
  command.insert(command.end(), args.begin(), args.end());
  return ddp::launcher::testing::run_ddprun(command, scratch, env, std::chrono::seconds(240));
}

/// `base` followed by `more`: a trainer's flags with a run's own.
inline std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

/// Starts `program` with `args` under ddprun, `launcher` being ddprun's own
/// flags (before the program); returns what ddprun returned.
using LaunchTrainer = std::function<ddp::launcher::testing::DdprunResult(
    const std::string& program, const std::vector<std::string>& args, const ddp::launcher::testing::ScratchDir&,
    const std::vector<std::string>& launcher)>;

/// Runs `steps` steps straight, then the same run killed after `fail_at`
/// (checkpoints every `every` steps) and restarted by ddprun: every step's
/// loss must come out the same. `note`: a line the straight run must print.
inline void expect_exact_resume(const LaunchTrainer& launch, const std::string& program,
                                const std::vector<std::string>& base, int steps, int fail_at, int every,
                                const std::string& note = "") {
  const ddp::launcher::testing::ScratchDir scratch;
  const std::string straight = scratch.path() + "/straight.jsonl";
  const std::string resumed = scratch.path() + "/resumed.jsonl";
  const auto run_straight =
      launch(program, with(base, {"--steps", std::to_string(steps), "--metrics", straight}), scratch, {});
  ASSERT_EQ(run_straight.exit_code, 0) << run_straight.output;
  ASSERT_NE(run_straight.output.find(note), std::string::npos) << run_straight.output;
  const auto run_resumed = launch(
      program,
      with(base, {"--steps", std::to_string(steps), "--metrics", resumed, "--checkpoint", scratch.path() + "/ckpt.pt",
                  "--checkpoint-every", std::to_string(every), "--resume", "--fail-at-step", std::to_string(fail_at)}),
      scratch, {"--max-restarts", "1"});
  ASSERT_EQ(run_resumed.exit_code, 0) << run_resumed.output;
  ASSERT_NE(run_resumed.output.find("aborting to test the restart"), std::string::npos) << run_resumed.output;
  ASSERT_NE(run_resumed.output.find("resumed from"), std::string::npos) << run_resumed.output;
  const auto expected = losses(straight);
  const auto actual = losses(resumed);
  ASSERT_EQ(expected.size(), static_cast<size_t>(steps));
  ASSERT_EQ(actual.size(), static_cast<size_t>(steps));
  for (const auto& [step, loss] : expected) {
    EXPECT_NEAR(actual.at(step), loss, 1e-5 * std::max(1.0, std::abs(loss))) << "step " << step;
  }
}

}  // namespace examples::testing
