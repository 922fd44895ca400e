// ddprun's option parsing and SLURM derivation, in process.

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>

#include "launcher/launch_options.h"
#include "launcher/ports.h"
#include "launcher/slurm.h"

namespace ddp::launcher {
namespace {

LaunchOptions parse(const std::vector<std::string>& args) {
  bool help = false;
  return parse_launch_options(args, help);
}

/// Sets an environment variable for one test.
class ScopedVariable {
 public:
  ScopedVariable(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedVariable() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(LaunchOptions, ParsesNodeAndRestartOptionsInBothSpellings) {
  const ScopedVariable token("DDP_RDZV_TOKEN", "shared-secret");
  const std::string port = std::to_string(free_port());
  const LaunchOptions options = parse({"--nnodes", "3", "--node_rank=2", "--nproc-per-node", "4", "--master-addr",
                                       "10.0.0.1", "--master-port", port, "--max-restarts=5", "--rdzv-timeout", "90",
                                       "--timeout", "30", "--rdzv_id=train-7", "/bin/true", "--nnodes", "7"});
  EXPECT_EQ(options.nnodes, 3);
  EXPECT_EQ(options.node_rank, 2);
  EXPECT_EQ(options.nproc_per_node, 4);
  EXPECT_EQ(options.master_addr, "10.0.0.1");
  EXPECT_EQ(options.master_port, std::stoi(port));
  EXPECT_EQ(options.max_restarts, 5);
  EXPECT_EQ(options.rdzv_timeout_s, 90);
  EXPECT_EQ(options.timeout_s, 30);
  EXPECT_EQ(options.rdzv_id, "train-7");
  EXPECT_EQ(options.rdzv_token, "shared-secret");
  EXPECT_TRUE(options.log_dir.empty());
  // Everything after the program belongs to the program.
  EXPECT_EQ(options.command, (std::vector<std::string>{"/bin/true", "--nnodes", "7"}));
}

TEST(LaunchOptions, RejectsBadValuesNamingTheOption) {
  const std::map<std::vector<std::string>, std::string> cases = {
      {{"--nnodes", "0", "/bin/true"}, "--nnodes must be in [1"},
      {{"--node-rank", "-1", "/bin/true"}, "--node-rank must be in [0"},
      {{"--max-restarts", "many", "/bin/true"}, "--max-restarts expects an integer, got 'many'"},
      {{"--rdzv-timeout", "0", "/bin/true"}, "--rdzv-timeout must be in [1"},
      {{"--timeout", "-5", "/bin/true"}, "--timeout must be in [1"},
      {{"--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "/bin/true"},
       "--node-rank 2 must be smaller than --nnodes 2"},
      {{"--standalone", "--nnodes", "2", "/bin/true"}, "--standalone runs on one node"},
      {{"--tee", "--standalone", "/bin/true"}, "--tee copies the --log-dir files"},
      {{"--log-dir", "/proc/ddprun_logs", "--standalone", "/bin/true"}, "--log-dir /proc/ddprun_logs"},
      {{"--nnodes"}, "--nnodes needs a value"},
  };
  for (const auto& [args, message] : cases) {
    SCOPED_TRACE(args.front());
    try {
      parse(args);
      ADD_FAILURE() << "accepted";
    } catch (const LaunchUsageError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

// --nproc-per-node gpu: CUDA_VISIBLE_DEVICES names the GPUs to use, but a host without any has none to start
// workers on (it counted the list: two workers that each failed to find a GPU).
TEST(VisibleGpuCount, AListNeverCountsMoreGpusThanTheHostHas) {
  EXPECT_EQ(visible_gpu_count(nullptr, 3), 3);
  EXPECT_EQ(visible_gpu_count("0,1", 0), 0);
  EXPECT_EQ(visible_gpu_count("0,1", 8), 2);
  EXPECT_EQ(visible_gpu_count("0,1,2,3", 2), 2);
  EXPECT_EQ(visible_gpu_count("GPU-0a1b,GPU-2c3d", -1), 2);  // WSL2: the driver lists no GPU in /proc
  EXPECT_EQ(visible_gpu_count("", 4), 0);
  EXPECT_EQ(visible_gpu_count("-1", 4), 0);
  EXPECT_EQ(visible_gpu_count(nullptr, -1), 0);
  EXPECT_EQ(visible_gpu_count("MIG-a1,MIG-b2,MIG-c3", 1), 3);  // MIG instances share a GPU
  const ScopedVariable unset("CUDA_VISIBLE_DEVICES", nullptr);
  if (visible_gpu_count() == 0) {  // a host without GPUs, as CI's
    const ScopedVariable visible("CUDA_VISIBLE_DEVICES", "0,1");
    EXPECT_EQ(visible_gpu_count(), 0) << "this host lists no GPU, whatever CUDA_VISIBLE_DEVICES says";
  }
}

TEST(SlurmNodeList, FirstHostOfEachForm) {
  EXPECT_EQ(first_slurm_host("node17"), "node17");
  EXPECT_EQ(first_slurm_host("node[01-04,07]"), "node01");
  EXPECT_EQ(first_slurm_host("node[07,01-04]"), "node07");
  EXPECT_EQ(first_slurm_host("alpha,beta,gamma"), "alpha");
  EXPECT_EQ(first_slurm_host("gpu[3-4],cpu[1-8]"), "gpu3");
  EXPECT_EQ(first_slurm_host("rack[2-3]-node[001-016]"), "rack2-node001");
  EXPECT_THROW(first_slurm_host("node[01-04"), LaunchUsageError);
  EXPECT_THROW(first_slurm_host(""), LaunchUsageError);
}

EnvLookup lookup_in(std::map<std::string, std::string> env) {
  return [env](const std::string& name) -> std::optional<std::string> {
    const auto found = env.find(name);
    if (found == env.end()) return std::nullopt;
    return found->second;
  };
}

TEST(SlurmPlacement, NoneOutsideSlurm) {
  EXPECT_FALSE(slurm_placement(lookup_in({{"SLURM_NNODES", "4"}})).has_value());
}

TEST(SlurmPlacement, StepVariablesWinOverTheJobs) {
  const auto placement = slurm_placement(lookup_in({{"SLURM_JOB_ID", "77"},
                                                    {"SLURM_NNODES", "8"},
                                                    {"SLURM_JOB_NODELIST", "big[01-08]"},
                                                    {"SLURM_STEP_NUM_NODES", "2"},
                                                    {"SLURM_STEP_NODELIST", "big[05-06]"},
                                                    {"SLURM_NODEID", "1"}}));
  ASSERT_TRUE(placement.has_value());
  EXPECT_EQ(placement->job_id, "77");
  EXPECT_EQ(placement->nnodes, 2);
  EXPECT_EQ(placement->node_rank, 1);
  EXPECT_EQ(placement->master_addr, "big05");
}

TEST(SlurmPlacement, MissingOrInconsistentVariablesAreNamed) {
  const std::map<std::string, std::string> base = {
      {"SLURM_JOB_ID", "1"}, {"SLURM_NNODES", "2"}, {"SLURM_NODEID", "0"}, {"SLURM_JOB_NODELIST", "n[1-2]"}};
  const std::map<std::string, std::string> cases = {
      {"SLURM_NODEID", "SLURM_NODEID is not"},
      {"SLURM_NNODES", "neither SLURM_STEP_NUM_NODES nor SLURM_NNODES"},
      {"SLURM_JOB_NODELIST", "neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST"},
  };
  for (const auto& [missing, message] : cases) {
    SCOPED_TRACE(missing);
    auto env = base;
    env.erase(missing);
    try {
      slurm_placement(lookup_in(env));
      ADD_FAILURE() << "accepted";
    } catch (const LaunchUsageError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
  auto env = base;
  env["SLURM_NODEID"] = "2";
  EXPECT_THROW(slurm_placement(lookup_in(env)), LaunchUsageError);
}

TEST(LaunchOptions, AJobOnOneNodeGetsARandomTokenAndOneOnSeveralMustBeGivenOne) {
  const ScopedVariable unset("DDP_RDZV_TOKEN", nullptr);
  const std::string first = parse({"--standalone", "/bin/true"}).rdzv_token;
  EXPECT_EQ(first.size(), 32u) << first;
  EXPECT_NE(first, parse({"--standalone", "/bin/true"}).rdzv_token) << "one secret per job";
  try {
    parse({"--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "/bin/true"});
    ADD_FAILURE() << "a job on two nodes started without a shared secret";
  } catch (const LaunchUsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--nnodes 2 needs DDP_RDZV_TOKEN"), std::string::npos) << e.what();
  }
  const ScopedVariable given("DDP_RDZV_TOKEN", "from-the-user");
  EXPECT_EQ(parse({"--standalone", "/bin/true"}).rdzv_token, "from-the-user");
}

}  // namespace
}  // namespace ddp::launcher
