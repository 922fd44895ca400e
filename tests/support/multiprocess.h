#pragma once

// Runs a test body in several real processes, one per rank, the way
// PyTorch's MultiProcessTestCase does: the test binary re-executes itself
// filtered to the current test, with RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set. Each child runs the body
// for its rank and reports any exception back to the parent.

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace ddp::testing {

struct RankOutcome {
  int rank = 0;
  int exit_code = -1;    ///< -1 when killed by a signal.
  int signal = 0;
  bool hung = false;     ///< Killed by the harness after RunOptions::timeout.
  std::string error;     ///< What the body threw, if anything.
  double seconds = 0;    ///< Wall time of the process.
};

struct RunOptions {
  std::chrono::seconds timeout{180};          ///< Then every rank still running is killed.
  std::map<std::string, std::string> env;     ///< Extra or overriding variables.
  std::map<int, std::map<std::string, std::string>> rank_env;  ///< Per-rank extras.
};

/// In the parent: starts `world_size` processes and returns how each ended.
/// In a child: runs body(rank) and exits; never returns.
std::vector<RankOutcome> run_ranks(int world_size, const std::function<void(int rank)>& body,
                                   const RunOptions& options = {});

/// Fails the current test (with every rank's error) unless every rank exited 0.
void expect_all_succeeded(const std::vector<RankOutcome>& outcomes);

/// Throws std::runtime_error(what) unless condition holds: checks inside rank bodies.
void require(bool condition, const std::string& what);

}  // namespace ddp::testing
