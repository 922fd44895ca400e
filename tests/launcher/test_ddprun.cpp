// ddprun as users run it: real processes, real signals. The workers are
// launcher_probe (see its source); every test checks that none is left.

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "ddprun_runner.h"
#include "launcher/ports.h"

namespace ddp::launcher::testing {
namespace {

using std::chrono::seconds;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct Coordinates {
  int rank, local_rank, world, local_world, node_rank, nnodes;
  std::string master_addr;
  int restart = 0;
};

void expect_coordinates(const std::map<std::string, std::string>& env, const Coordinates& want) {
  SCOPED_TRACE("rank " + std::to_string(want.rank));
  EXPECT_EQ(env.at("RANK"), std::to_string(want.rank));
  EXPECT_EQ(env.at("LOCAL_RANK"), std::to_string(want.local_rank));
  EXPECT_EQ(env.at("WORLD_SIZE"), std::to_string(want.world));
  EXPECT_EQ(env.at("LOCAL_WORLD_SIZE"), std::to_string(want.local_world));
  EXPECT_EQ(env.at("GROUP_RANK"), std::to_string(want.node_rank));
  EXPECT_EQ(env.at("GROUP_WORLD_SIZE"), std::to_string(want.nnodes));
  EXPECT_EQ(env.at("ROLE_RANK"), std::to_string(want.rank));
  EXPECT_EQ(env.at("ROLE_WORLD_SIZE"), std::to_string(want.world));
  EXPECT_EQ(env.at("MASTER_ADDR"), want.master_addr);
  EXPECT_EQ(env.at("TORCHELASTIC_RESTART_COUNT"), std::to_string(want.restart));
}

std::map<std::string, std::string> probe_env(const ScratchDir& dir, int rank, int restart = 0) {
  const std::string path = dir.path() + "/env_" + std::to_string(restart) + "_" + std::to_string(rank);
  EXPECT_TRUE(std::filesystem::exists(path)) << path;
  return read_env_file(path);
}

TEST(Ddprun, BadInputExitsWithCode2AndStartsNothing) {
  ScratchDir scratch;
  ListeningSocket busy;
  const std::string probe = PROBE_PATH;
  const std::string dir = scratch.path();
  const std::string not_a_folder = dir + "/file";
  std::ofstream(not_a_folder) << "x";
  const std::string free = std::to_string(free_port());
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--bogus", probe, "env", dir}, "unknown option '--bogus'"},
      {{"--nproc-per-node", "0", "--standalone", probe, "env", dir}, "--nproc-per-node must be in [1"},
      {{"--nnodes", "2", "--node-rank", "2", "--master-port", free, probe, "env", dir},
       "--node-rank 2 must be smaller than --nnodes 2"},
      {{"--standalone", "--nnodes", "2", probe, "env", dir}, "--standalone runs on one node"},
      {{"--standalone", "--master-addr", "10.9.9.9", probe, "env", dir},
       "--standalone serves the rendezvous on loopback; drop --master-addr"},
      {{"--master-port", std::to_string(busy.port()), probe, "env", dir},
       "--master-port " + std::to_string(busy.port()) + " cannot be used on this host"},
      {{"--standalone", dir + "/no_such_program"},
       "program '" + dir + "/no_such_program' does not exist or is not executable"},
      {{"--standalone", dir}, "program '" + dir + "' does not exist or is not executable"},
      {{"--standalone", not_a_folder}, "program '" + not_a_folder + "' does not exist or is not executable"},
      {{"--nnodes", "2", "--node-rank", "1", probe, "env", dir}, "--nnodes 2 needs --master-addr"},
      {{"--nnodes", "2", "--node-rank", "1", "--master-addr", "bad..host", probe, "env", dir},
       "--master-addr 'bad..host' does not resolve on this host"},
      {{"--standalone", "--log-dir", not_a_folder + "/logs", probe, "env", dir},
       "--log-dir " + not_a_folder + "/logs: cannot create the folder"},
      {{"--standalone", "--log-dir", "/sys/kernel", probe, "env", dir}, "--log-dir /sys/kernel: cannot write in it"},
      {{"--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", probe, "env", dir},
       "--nnodes 2 needs DDP_RDZV_TOKEN"},
      {{"--standalone", "--tee=false", probe, "env", dir}, "--tee takes no value (got '--tee=false')"},
      {{"--standalone=no", probe, "env", dir}, "--standalone takes no value (got '--standalone=no')"},
      {{"--help=0", probe, "env", dir}, "--help takes no value (got '--help=0')"},
  };
  for (const auto& [args, message] : cases) {
    SCOPED_TRACE(message);
    const DdprunResult result = run_ddprun(args, scratch, {{"DDP_RDZV_TOKEN", std::nullopt}});
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_TRUE(contains(result.output, "ddprun: error: " + message)) << result.output;
    EXPECT_TRUE(contains(result.output, "usage: ddprun")) << result.output;
    EXPECT_EQ(scratch.files(), std::vector<std::string>{"file"}) << "a worker was started";
  }
}

// Workers read nothing of ddprun's input (in groups of their own, one that
// read a terminal would be stopped for good); and a reader of ddprun's output
// that goes away ends the job with a message, not a silent SIGPIPE.
TEST(Ddprun, WorkersReadNoInputAndAClosedOutputEndsTheJobWithAMessage) {
  ScratchDir scratch;
  DdprunResult result = run_ddprun(
      {"--standalone", "--nproc-per-node", "2", "/bin/sh", "-c", "read -r line; echo \"read [$line]\""}, scratch);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "[rank0]: read []")) << result.output;
  EXPECT_TRUE(contains(result.output, "[rank1]: read []")) << result.output;
  EXPECT_FALSE(contains(result.output, kDdprunInput)) << result.output;

  // ddprun's output into a pipe whose reader goes away: `ddprun ... | head -1`.
  const std::string errors = scratch.path() + "/pipe.err";
  const std::string pipeline = std::string(DDPRUN_PATH) + " --standalone /bin/sh -c 'while echo line; do :; done' 2>" +
                               errors + " | head -1 >/dev/null";
  ASSERT_EQ(std::system(pipeline.c_str()), 0);
  EXPECT_TRUE(contains(read_file(errors), "ddprun: writing worker output failed")) << read_file(errors);
}

TEST(Ddprun, TakenPortOnlyMattersOnNodeRank0) {
  ScratchDir scratch;
  ListeningSocket busy;
  // Node 1 connects to node 0's store and hosts nothing, so its own port is irrelevant.
  const DdprunResult result =
      run_ddprun({"--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
                  "--master-port", std::to_string(busy.port()), PROBE_PATH, "env", scratch.path()},
                 scratch, {{"DDP_RDZV_TOKEN", "shared-secret"}});
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(probe_env(scratch, 1).at("MASTER_PORT"), std::to_string(busy.port()));
}

TEST(Ddprun, OneProcessEnvironment) {
  ScratchDir scratch;
  const int port = free_port();
  const DdprunResult result = run_ddprun(
      {"--nproc-per-node", "1", "--master-port", std::to_string(port), PROBE_PATH, "env", scratch.path()}, scratch,
      {{"RANK", "99"},
       {"WORLD_SIZE", "99"},
       {"DDPRUN_TEST_PASSTHROUGH", "a b=c"},
       {"NCCL_NVLS_ENABLE", "0"},
       {"TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"},
       {"OMP_NUM_THREADS", std::nullopt},
       {"DDP_RDZV_TIMEOUT", std::nullopt},
       {"DDP_TIMEOUT", std::nullopt}});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto env = probe_env(scratch, 0);
  expect_coordinates(env, {0, 0, 1, 1, 0, 1, "127.0.0.1"});
  EXPECT_EQ(env.at("MASTER_PORT"), std::to_string(port));
  EXPECT_EQ(env.at("TORCHELASTIC_MAX_RESTARTS"), "0");
  EXPECT_EQ(env.at("DDPRUN_TEST_PASSTHROUGH"), "a b=c");
  EXPECT_EQ(env.at("NCCL_NVLS_ENABLE"), "0");
  EXPECT_EQ(env.at("TORCH_SYMM_MEM_DISABLE_MULTICAST"), "1");
  EXPECT_EQ(env.count("OMP_NUM_THREADS"), 0u) << "one process per node needs no thread limit";
  EXPECT_EQ(env.count("DDP_RDZV_TIMEOUT"), 0u);
  EXPECT_EQ(env.count("DDP_TIMEOUT"), 0u);
  EXPECT_TRUE(contains(result.output, "rank 0: exited with code 0")) << result.output;
}

TEST(Ddprun, ThreeProcessEnvironment) {
  ScratchDir scratch;
  const DdprunResult result = run_ddprun({"--standalone", "--nproc-per-node", "3", "--rdzv-timeout", "42", "--timeout",
                                          "7", PROBE_PATH, "env", scratch.path()},
                                         scratch, {{"OMP_NUM_THREADS", std::nullopt}});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "OMP_NUM_THREADS is unset; setting it to 1")) << result.output;
  std::string port, run_id, token;
  for (int rank = 0; rank < 3; ++rank) {
    const auto env = probe_env(scratch, rank);
    expect_coordinates(env, {rank, rank, 3, 3, 0, 1, "127.0.0.1"});
    EXPECT_EQ(env.at("OMP_NUM_THREADS"), "1");
    EXPECT_EQ(env.at("DDP_RDZV_TIMEOUT"), "42");
    EXPECT_EQ(env.at("DDP_TIMEOUT"), "7");
    if (rank == 0) port = env.at("MASTER_PORT");
    EXPECT_EQ(env.at("MASTER_PORT"), port) << "all ranks must meet at one store";
    if (rank == 0) run_id = env.at("TORCHELASTIC_RUN_ID");
    EXPECT_EQ(env.at("TORCHELASTIC_RUN_ID"), run_id) << "one job, one identity";
    if (rank == 0) token = env.at("DDP_RDZV_TOKEN");
    EXPECT_EQ(env.at("DDP_RDZV_TOKEN"), token) << "one job, one secret";
  }
  EXPECT_NE(port, "29500") << "--standalone picks a free port";
  EXPECT_EQ(run_id.size(), 16u) << "a random identity per job: " << run_id;
  EXPECT_EQ(token.size(), 32u) << "a random secret per job: " << token;
}

TEST(Ddprun, TwoNodesOfTwoProcessesEnvironment) {
  ScratchDir scratch;
  const std::string port = std::to_string(free_port());
  for (int node = 0; node < 2; ++node) {
    ScratchDir output;
    const DdprunResult result =
        run_ddprun({"--nnodes", "2", "--node-rank", std::to_string(node), "--nproc-per-node", "2", "--master-addr",
                    "10.9.8.7", "--master-port", port, PROBE_PATH, "env", scratch.path()},
                   output, {{"OMP_NUM_THREADS", "4"}, {"DDP_RDZV_TOKEN", "shared-secret"}});
    ASSERT_EQ(result.exit_code, 0) << result.output;
  }
  for (int rank = 0; rank < 4; ++rank) {
    const auto env = probe_env(scratch, rank);
    expect_coordinates(env, {rank, rank % 2, 4, 2, rank / 2, 2, "10.9.8.7"});
    EXPECT_EQ(env.at("MASTER_PORT"), port);
    EXPECT_EQ(env.at("OMP_NUM_THREADS"), "4") << "a value the user set is kept";
    EXPECT_EQ(env.at("DDP_RDZV_TOKEN"), "shared-secret") << "every node presents the secret it was given";
  }
}

TEST(Ddprun, SlurmVariablesGiveTheNodePlacement) {
  ScratchDir scratch;
  const std::string port = std::to_string(free_port());
  const EnvChanges slurm = {{"SLURM_JOB_ID", "4242"},
                            {"SLURM_NNODES", "2"},
                            {"SLURM_NODEID", "1"},
                            {"SLURM_JOB_NODELIST", "node[07-08]"},
                            {"DDP_RDZV_TOKEN", "shared-secret"}};
  const DdprunResult result =
      run_ddprun({"--nproc-per-node", "2", "--master-port", port, PROBE_PATH, "env", scratch.path()}, scratch, slurm);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "node 1 of 2 (from SLURM job 4242)")) << result.output;
  for (int rank = 2; rank < 4; ++rank) {
    expect_coordinates(probe_env(scratch, rank), {rank, rank - 2, 4, 2, 1, 2, "node07"});
  }
}

TEST(Ddprun, ExplicitNodeOptionsWinOverSlurm) {
  ScratchDir scratch;
  const DdprunResult result = run_ddprun(
      {"--nnodes", "1", "--nproc-per-node", "1", "--master-port", std::to_string(free_port()), PROBE_PATH, "env",
       scratch.path()},
      scratch, {{"SLURM_JOB_ID", "4242"}, {"SLURM_NNODES", "2"}, {"SLURM_NODEID", "1"}, {"SLURM_JOB_NODELIST", "n[1-2]"}});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  expect_coordinates(probe_env(scratch, 0), {0, 0, 1, 1, 0, 1, "127.0.0.1"});
}

TEST(Ddprun, IncompleteSlurmEnvironmentIsAUsageError) {
  ScratchDir scratch;
  const DdprunResult result =
      run_ddprun({"--nproc-per-node", "1", PROBE_PATH, "env", scratch.path()}, scratch,
                 {{"SLURM_JOB_ID", "4242"}, {"SLURM_NNODES", "2"}, {"SLURM_JOB_NODELIST", "n[1-2]"}});
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(contains(result.output, "SLURM_NODEID is not")) << result.output;
  EXPECT_TRUE(scratch.files().empty());
}

TEST(Ddprun, OneFailingRankStopsTheOthersQuickly) {
  ScratchDir scratch;
  const DdprunResult result = run_ddprun(
      {"--standalone", "--nproc-per-node", "3", PROBE_PATH, "fail-rank", "1", scratch.path()}, scratch, {}, seconds(20));
  const std::vector<pid_t> pids = wait_for_pid_files(scratch.path(), 3, seconds(0));
  EXPECT_EQ(pids.size(), 3u);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  // The others sleep 60 s; SIGTERM must end them, well before the 5 s grace.
  EXPECT_LT(result.seconds, 10.0) << result.output;
  EXPECT_TRUE(contains(result.output, "ddprun: rank 1 exited with code 3; stopping the other workers")) << result.output;
  EXPECT_TRUE(contains(result.output, "rank 0: was killed by signal 15")) << result.output;
  EXPECT_TRUE(contains(result.output, "first error: probe: error: rank 1 failing on purpose")) << result.output;
  EXPECT_TRUE(contains(result.output, "ddprun: job failed: rank 1 failed first")) << result.output;
  EXPECT_EQ(wait_until_dead(pids, seconds(2)), std::vector<pid_t>{});
}

// A stopped worker (kill -STOP) cannot act on SIGTERM: ddprun continues it,
// so the job ends at once instead of after the 5 s grace period.
TEST(Ddprun, AStoppedWorkerIsStoppedWithoutWaitingForTheGracePeriod) {
  ScratchDir scratch;
  const std::string script = "if [ \"$RANK\" = 0 ]; then kill -STOP $$; else sleep 1; exit 3; fi";
  const DdprunResult result =
      run_ddprun({"--standalone", "--nproc-per-node", "2", "/bin/sh", "-c", script}, scratch, {}, seconds(20));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(contains(result.output, "rank 0: was killed by signal 15")) << result.output;
  EXPECT_LT(result.seconds, 4.0) << result.output;
}

/// Starts two sleeping workers, signals ddprun, and checks that no worker
/// outlives it.
void expect_signal_leaves_no_workers(int signal, std::chrono::seconds bound) {
  ScratchDir scratch;
  // --max-restarts: a signal to ddprun must stop the job, not restart it.
  const DdprunProcess ddprun = start_ddprun(
      {"--standalone", "--nproc-per-node", "2", "--max-restarts", "3", PROBE_PATH, "sleep", scratch.path()}, scratch);
  const std::vector<pid_t> pids = wait_for_pid_files(scratch.path(), 2, seconds(10));
  EXPECT_EQ(pids.size(), 2u);
  ASSERT_EQ(::kill(ddprun.pid, signal), 0);
  const DdprunResult result = wait_ddprun(ddprun, bound);
  if (signal == SIGKILL) {
    EXPECT_EQ(result.signal, SIGKILL);
  } else {
    EXPECT_EQ(result.exit_code, 128 + signal) << result.output;
    EXPECT_TRUE(contains(result.output, "rank 1: was killed by signal " + std::to_string(signal))) << result.output;
    EXPECT_FALSE(contains(result.output, "restarting")) << result.output;
  }
  EXPECT_EQ(wait_until_dead(pids, seconds(5)), std::vector<pid_t>{}) << "workers outlived ddprun";
}

TEST(Ddprun, SigintStopsAllWorkers) { expect_signal_leaves_no_workers(SIGINT, seconds(10)); }

TEST(Ddprun, SigtermStopsAllWorkers) { expect_signal_leaves_no_workers(SIGTERM, seconds(10)); }

TEST(Ddprun, SigkillOfDdprunLeavesNoWorkers) { expect_signal_leaves_no_workers(SIGKILL, seconds(5)); }

// A worker that is a wrapper script without exec: its program runs as the
// script's child. SIGKILL of ddprun reaches the script through its
// parent-death signal only; the children must go too (the group keeper).
TEST(Ddprun, SigkillOfDdprunLeavesNoGrandchildren) {
  ScratchDir scratch;
  const std::string wrapper = std::string(PROBE_PATH) + " sleep " + scratch.path() + "; true";
  const DdprunProcess ddprun =
      start_ddprun({"--standalone", "--nproc-per-node", "2", "/bin/sh", "-c", wrapper}, scratch);
  const std::vector<pid_t> pids = wait_for_pid_files(scratch.path(), 2, seconds(10));
  EXPECT_EQ(pids.size(), 2u);
  ASSERT_EQ(::kill(ddprun.pid, SIGKILL), 0);
  const DdprunResult result = wait_ddprun(ddprun, seconds(5));
  EXPECT_EQ(result.signal, SIGKILL);
  EXPECT_EQ(wait_until_dead(pids, seconds(5)), std::vector<pid_t>{}) << "a wrapper's children outlived ddprun";
}

/// A worker script that starts a child in a session of its own (setsid),
/// leaves the child's pid in `dir` for wait_for_pid_files, then runs `then`.
std::string escaping_worker(const std::string& dir, const std::string& then) {
  const std::string file = dir + "/pid_escaped";
  return "setsid sleep 300 & echo $! > " + file + ".partial; mv " + file + ".partial " + file + "; " + then;
}

/// Expects `pid` to be gone within 5 s; kills it if not, so that no test leaves it behind.
void expect_dies(pid_t pid, const std::string& what) {
  const std::vector<pid_t> alive = wait_until_dead({pid}, seconds(5));
  for (pid_t survivor : alive) ::kill(survivor, SIGKILL);
  EXPECT_EQ(alive, std::vector<pid_t>{}) << what;
}

// A doctor killed while its probe job runs takes the job with it: the job's
// ddprun gets SIGTERM as the doctor dies and stops its workers. (The job
// went on, its parent gone, and held the GPUs for minutes.) A doctor stopped
// by SIGTERM also removes its scratch folder (it stayed in TMPDIR) and dies of the signal.
TEST(Ddprun, AKilledDoctorLeavesNoProbeJobAndNoScratchFolder) {
  namespace fs = std::filesystem;
  ScratchDir scratch;
  const fs::path bin = fs::path(scratch.path()) / "bin";
  fs::create_directories(bin);
  fs::copy_file(DDPRUN_PATH, bin / "ddprun");
  const fs::path probe = bin / "ddp_doctor_probe";  // beside ddprun, where the doctor looks for it
  std::ofstream(probe) << "#!/bin/sh\n"
                          "echo $$ > \""
                       << scratch.path()
                       << "/pid_$RANK.partial\"\n"
                          "mv \""
                       << scratch.path() << "/pid_$RANK.partial\" \"" << scratch.path()
                       << "/pid_$RANK\"\n"
                          "exec sleep 120\n";
  fs::permissions(probe, fs::perms::owner_all);
  const std::string doctor_path = (bin / "ddprun").string();
  const std::string temporary = scratch.path() + "/tmp";
  fs::create_directories(temporary);
  const pid_t doctor = ::fork();
  ASSERT_GE(doctor, 0);
  if (doctor == 0) {
    const int nothing = ::open("/dev/null", O_WRONLY);
    if (nothing < 0 || ::dup2(nothing, STDOUT_FILENO) < 0 || ::dup2(nothing, STDERR_FILENO) < 0) ::_exit(126);
    ::setenv("TMPDIR", temporary.c_str(), 1);
    ::execl(doctor_path.c_str(), "ddprun", "--doctor", nullptr);
    ::_exit(127);
  }
  const std::vector<pid_t> workers = wait_for_pid_files(scratch.path(), 1, seconds(60));
  ASSERT_EQ(::kill(doctor, SIGTERM), 0);
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + seconds(30);
  pid_t waited = 0;
  while ((waited = ::waitpid(doctor, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (waited == 0) {
    ::kill(doctor, SIGKILL);
    ::waitpid(doctor, &status, 0);
  }
  ASSERT_EQ(waited, doctor) << "the doctor did not stop within 30 s of SIGTERM";
  ASSERT_FALSE(workers.empty()) << "the probe job never started";
  for (pid_t worker : workers) expect_dies(worker, "a probe worker outlived the killed doctor");
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "the doctor's wait status: " << status;
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(temporary)) left.push_back(entry.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{}) << "the stopped doctor left its scratch folder";
}

// A worker's descendant that leaves its process group (setsid, a daemon)
// and holds the worker's output open: ddprun, its subreaper, kills it when
// the job ends instead of waiting for it or leaving it to init.
TEST(Ddprun, ADescendantThatLeftItsGroupIsKilledWhenTheJobEnds) {
  ScratchDir scratch;
  const std::string script = escaping_worker(scratch.path(), "exit 3");
  const DdprunResult result =
      run_ddprun({"--standalone", "--nproc-per-node", "1", "/bin/sh", "-c", script}, scratch, {}, seconds(20));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(contains(result.output, "killed 1 process(es) the workers left behind")) << result.output;
  const std::vector<pid_t> escaped = wait_for_pid_files(scratch.path(), 1, seconds(1));
  ASSERT_EQ(escaped.size(), 1u) << "the worker wrote no pid";
  expect_dies(escaped[0], "a setsid descendant outlived the job");
}

// ddprun ended by an error of its own while the job runs (here: forwarding a
// worker's output into a pipe nobody reads) takes the job down with it,
// grandchildren included, as its death would.
TEST(Ddprun, AnErrorInsideDdprunLeavesNoWorkerBehind) {
  ScratchDir scratch;
  const std::string file = scratch.path() + "/pid_child";
  const std::string worker =
      "sleep 300 & echo $! > " + file + ".partial; mv " + file + ".partial " + file + "; sleep 1; echo out; sleep 100";
  const std::string command = "(trap '' PIPE; exec " + std::string(DDPRUN_PATH) +
                              " --standalone --nproc-per-node 1 /bin/sh -c '" + worker + "') 2> " + scratch.path() +
                              "/stderr | true";
  const auto start = std::chrono::steady_clock::now();
  ASSERT_NE(std::system(command.c_str()), -1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(20)) << "ddprun did not end on its error";
  const std::string output = read_file(scratch.path() + "/stderr");
  EXPECT_TRUE(contains(output, "Broken pipe")) << output;
  const std::vector<pid_t> children = wait_for_pid_files(scratch.path(), 1, seconds(1));
  ASSERT_EQ(children.size(), 1u) << "the worker wrote no pid";
  expect_dies(children[0], "a worker's child outlived ddprun's error");
}

// The same descendant when ddprun itself is SIGKILLed: it is in no worker's
// group, and becomes init's; the group keeper, which saw it, kills it.
TEST(Ddprun, SigkillOfDdprunLeavesNoDescendantThatLeftItsGroup) {
  ScratchDir scratch;
  const std::string script = escaping_worker(scratch.path(), "sleep 300");
  const DdprunProcess ddprun =
      start_ddprun({"--standalone", "--nproc-per-node", "1", "/bin/sh", "-c", script}, scratch);
  const std::vector<pid_t> escaped = wait_for_pid_files(scratch.path(), 1, seconds(10));
  ASSERT_EQ(escaped.size(), 1u) << "the worker wrote no pid";
  std::this_thread::sleep_for(std::chrono::seconds(3));  // the keeper looks every 0.5 s, if it gets the CPU
  ASSERT_EQ(::kill(ddprun.pid, SIGKILL), 0);
  EXPECT_EQ(wait_ddprun(ddprun, seconds(5)).signal, SIGKILL);
  expect_dies(escaped[0], "a setsid descendant outlived a SIGKILLed ddprun");
}

TEST(Ddprun, RestartsUntilTheProgramSucceeds) {
  ScratchDir scratch;
  const std::string logs = scratch.path() + "/logs";
  const DdprunResult result = run_ddprun({"--standalone", "--nproc-per-node", "2", "--max-restarts", "2",
                                          "--log-dir", logs, "--tee", PROBE_PATH, "fail-before-restart", "2",
                                          scratch.path()},
                                         scratch);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (int restart = 0; restart <= 2; ++restart) {
    for (int rank = 0; rank < 2; ++rank) {
      const auto env = probe_env(scratch, rank, restart);
      expect_coordinates(env, {rank, rank, 2, 2, 0, 1, "127.0.0.1", restart});
      EXPECT_EQ(env.at("TORCHELASTIC_MAX_RESTARTS"), "2");
    }
    EXPECT_TRUE(std::filesystem::exists(logs + "/attempt_" + std::to_string(restart) + "/rank_1.log"));
  }
  EXPECT_TRUE(contains(result.output, "restarting all 2 local workers (restart 2 of 2)")) << result.output;
  EXPECT_TRUE(contains(result.output, "summary of attempt 3 of at most 3")) << result.output;
  EXPECT_TRUE(contains(result.output, "job succeeded after 2 restart(s)")) << result.output;
  EXPECT_TRUE(contains(read_file(logs + "/attempt_0/rank_0.log"), "rank 0 failing on purpose (restart count 0)"));
}

TEST(Ddprun, GivesUpAfterMaxRestarts) {
  ScratchDir scratch;
  const DdprunResult result = run_ddprun({"--standalone", "--nproc-per-node", "2", "--max-restarts", "1", PROBE_PATH,
                                          "fail-before-restart", "2", scratch.path()},
                                         scratch);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(std::filesystem::exists(scratch.path() + "/env_1_0"));
  EXPECT_FALSE(std::filesystem::exists(scratch.path() + "/env_2_0"));
  EXPECT_TRUE(contains(result.output, "job failed: rank 0 failed first in the last of 2 attempts")) << result.output;
}

TEST(Ddprun, LogDirWritesOneFilePerRank) {
  ScratchDir scratch;
  const std::string logs = scratch.path() + "/logs";
  const DdprunResult result =
      run_ddprun({"--standalone", "--nproc-per-node", "2", "--log-dir", logs, PROBE_PATH, "talk"}, scratch);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string log = read_file(logs + "/attempt_0/rank_" + std::to_string(rank) + ".log");
    EXPECT_TRUE(contains(log, "out line from rank " + std::to_string(rank) + "\n")) << log;
    EXPECT_TRUE(contains(log, "err line from rank " + std::to_string(rank) + "\n")) << log;
  }
  EXPECT_FALSE(contains(result.output, "line from rank")) << "without --tee nothing goes to the console";
  EXPECT_TRUE(contains(result.output, "goes to " + logs + "/attempt_0/rank_N.log")) << result.output;
}

TEST(Ddprun, TeeAlsoPrintsWithRankPrefix) {
  ScratchDir scratch;
  const std::string logs = scratch.path() + "/logs";
  const DdprunResult result =
      run_ddprun({"--standalone", "--nproc-per-node", "2", "--log-dir", logs, "--tee", PROBE_PATH, "talk"}, scratch);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "[rank1]: out line from rank 1")) << result.output;
  EXPECT_TRUE(contains(result.output, "[rank0]: err line from rank 0")) << result.output;
  EXPECT_TRUE(contains(read_file(logs + "/attempt_0/rank_1.log"), "out line from rank 1"));
}

}  // namespace
}  // namespace ddp::launcher::testing
