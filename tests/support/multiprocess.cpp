#include "support/multiprocess.h"
#include "support/remove_tree.h"

#include "launcher/ports.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

extern char** environ;

namespace ddp::testing {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

std::string current_test_filter() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string(info->test_suite_name()) + "." + info->name();
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

[[noreturn]] void run_as_child(int rank, const std::function<void(int)>& body) {
  int code = 0;
  try {
    body(rank);
  } catch (const std::exception& e) {
    std::ofstream(fs::path(std::getenv("DDP_TEST_RESULT_DIR")) / ("rank" + std::to_string(rank))) << e.what();
    code = 1;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  // Skip static destructors and the rest of the test binary: the parent
  // judges this rank by its exit code and error file alone.
  std::_Exit(code);
}

}  // namespace

void require(bool condition, const std::string& what) {
  if (!condition) throw std::runtime_error(what);
}

std::vector<RankOutcome> run_ranks(int world_size, const std::function<void(int)>& body,
                                   const RunOptions& options) {
  if (const char* rank = std::getenv("DDP_TEST_CHILD_RANK")) run_as_child(std::atoi(rank), body);

  const fs::path result_dir = fs::temp_directory_path() /
                              ("ddp_test_" + std::to_string(::getpid()) + "_" + std::to_string(launcher::free_port()));
  fs::create_directories(result_dir);
  const int port = launcher::free_port();

  std::vector<pid_t> pids(static_cast<size_t>(world_size), -1);
  std::vector<RankOutcome> outcomes(static_cast<size_t>(world_size));
  const std::string filter = "--gtest_filter=" + current_test_filter();
  const auto start = Clock::now();
  for (int rank = 0; rank < world_size; ++rank) {
    std::map<std::string, std::string> vars;
    for (char** entry = environ; *entry != nullptr; ++entry) {
      std::string item = *entry;
      vars[item.substr(0, item.find('='))] = item.substr(item.find('=') + 1);
    }
    vars["RANK"] = std::to_string(rank);
    vars["WORLD_SIZE"] = std::to_string(world_size);
    vars["LOCAL_RANK"] = std::to_string(rank);
    vars["LOCAL_WORLD_SIZE"] = std::to_string(world_size);
    vars["MASTER_ADDR"] = "127.0.0.1";
    vars["MASTER_PORT"] = std::to_string(port);
    vars["DDP_RDZV_TOKEN"] = "test-job-secret";  // what ddprun gives every job
    vars["DDP_TEST_CHILD_RANK"] = std::to_string(rank);
    vars["DDP_TEST_RESULT_DIR"] = result_dir.string();
    for (const auto& [name, value] : options.env) vars[name] = value;
    if (auto it = options.rank_env.find(rank); it != options.rank_env.end()) {
      for (const auto& [name, value] : it->second) vars[name] = value;
    }
    std::vector<std::string> env;
    for (const auto& [name, value] : vars) env.push_back(name + "=" + value);
    std::vector<char*> envp;
    for (auto& item : env) envp.push_back(item.data());
    envp.push_back(nullptr);
    std::string self = "/proc/self/exe";
    std::string program = fs::read_symlink(self).string();
    std::vector<char*> argv{program.data(), const_cast<char*>(filter.c_str()), nullptr};
    pid_t pid = -1;
    if (::posix_spawn(&pid, program.c_str(), nullptr, nullptr, argv.data(), envp.data()) != 0) {
      throw std::runtime_error("posix_spawn failed");
    }
    pids[static_cast<size_t>(rank)] = pid;
    outcomes[static_cast<size_t>(rank)].rank = rank;
  }

  int running = world_size;
  while (running > 0) {
    for (int rank = 0; rank < world_size; ++rank) {
      pid_t& pid = pids[static_cast<size_t>(rank)];
      if (pid < 0) continue;
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        RankOutcome& outcome = outcomes[static_cast<size_t>(rank)];
        outcome.seconds = std::chrono::duration<double>(Clock::now() - start).count();
        if (WIFEXITED(status)) outcome.exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) outcome.signal = WTERMSIG(status);
        pid = -1;
        --running;
      }
    }
    if (running > 0 && Clock::now() - start > options.timeout) {
      for (int rank = 0; rank < world_size; ++rank) {
        if (pids[static_cast<size_t>(rank)] > 0) {
          ::kill(pids[static_cast<size_t>(rank)], SIGKILL);
          outcomes[static_cast<size_t>(rank)].hung = true;
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (auto& outcome : outcomes) {
    const fs::path error_file = result_dir / ("rank" + std::to_string(outcome.rank));
    if (fs::exists(error_file)) outcome.error = read_file(error_file);
  }
  remove_tree(result_dir);
  return outcomes;
}

void expect_all_succeeded(const std::vector<RankOutcome>& outcomes) {
  for (const auto& outcome : outcomes) {
    EXPECT_TRUE(outcome.exit_code == 0 && !outcome.hung)
        << "rank " << outcome.rank << (outcome.hung ? " hung and was killed" : "") << " exit code "
        << outcome.exit_code << " signal " << outcome.signal << ": " << outcome.error;
  }
}

}  // namespace ddp::testing
