// Two ddprun instances as two nodes on loopback form one 4-rank Gloo job.

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "ddprun_runner.h"
#include "launcher/ports.h"

namespace ddp::launcher::testing {
namespace {

TEST(DdprunTwoNodes, FormOneGlooJobThatAllReducesCorrectly) {
  const std::string port = std::to_string(free_port());
  const EnvChanges env = {{"DDP_BACKEND", "gloo"}, {"OMP_NUM_THREADS", "1"}, {"DDP_RDZV_TOKEN", "shared-secret"}};
  ScratchDir node0_out, node1_out;
  const auto node = [&](int rank, const ScratchDir& out) {
    return start_ddprun({"--nnodes", "2", "--node-rank", std::to_string(rank), "--nproc-per-node", "2",
                         "--master-addr", "127.0.0.1", "--master-port", port, "--rdzv-timeout", "20",
                         ALLREDUCE_CHECK_PATH},
                        out, env);
  };
  // Node 1 first: its workers must wait for node 0's store, as on a cluster.
  const DdprunProcess node1 = node(1, node1_out);
  const DdprunProcess node0 = node(0, node0_out);
  const DdprunResult result0 = wait_ddprun(node0, std::chrono::seconds(30));
  const DdprunResult result1 = wait_ddprun(node1, std::chrono::seconds(30));
  EXPECT_EQ(result0.exit_code, 0) << result0.output;
  EXPECT_EQ(result1.exit_code, 0) << result1.output;
  for (int rank = 0; rank < 4; ++rank) {
    const std::string& output = rank < 2 ? result0.output : result1.output;
    const std::string line = "[rank" + std::to_string(rank) + "]: allreduce_check: rank " + std::to_string(rank) +
                             " of 4: sum 10, expected 10: correct";
    EXPECT_NE(output.find(line), std::string::npos) << output;
  }
}

// The store of a job across nodes listens on every interface: only the token keeps others out.
TEST(DdprunTwoNodes, ANodeWithoutTheJobsTokenIsRefusedAtOnce) {
  const std::string port = std::to_string(free_port());
  ScratchDir node0_out, node1_out;
  const auto node = [&](int rank, const ScratchDir& out, const std::string& token) {
    return start_ddprun({"--nnodes", "2", "--node-rank", std::to_string(rank), "--nproc-per-node", "1", "--master-addr",
                         "127.0.0.1", "--master-port", port, "--rdzv-timeout", "3", ALLREDUCE_CHECK_PATH},
                        out, {{"DDP_BACKEND", "gloo"}, {"OMP_NUM_THREADS", "1"}, {"DDP_RDZV_TOKEN", token}});
  };
  const DdprunProcess node0 = node(0, node0_out, "the-jobs-secret");
  const DdprunProcess node1 = node(1, node1_out, "a-guess");
  const DdprunResult result1 = wait_ddprun(node1, std::chrono::seconds(30));
  const DdprunResult result0 = wait_ddprun(node0, std::chrono::seconds(30));
  EXPECT_EQ(result1.exit_code, 1) << result1.output;
  EXPECT_NE(result1.output.find("refused this rank's DDP_RDZV_TOKEN"), std::string::npos) << result1.output;
  EXPECT_EQ(result1.output.find("the-jobs-secret"), std::string::npos) << "the secret leaked: " << result1.output;
  EXPECT_EQ(result0.exit_code, 1) << result0.output;
  EXPECT_NE(result0.output.find("only 1 of 2 ranks arrived"), std::string::npos) << result0.output;
}

// --standalone: the port ddprun picks is held listening until rank 0's store serves on that very socket. (It was
// released at the pick and bound again by rank 0: a process that took it in between, a connection's ephemeral
// port say, made the job fail at rendezvous.) The workers wait 2 s before they start; meanwhile the port is taken.
TEST(DdprunStandalone, TheRendezvousPortIsHeldFromItsPickUntilRankZeroServesOnIt) {
  ScratchDir out;
  const std::string dir = out.path();
  const std::string wrapper = "echo $MASTER_PORT > " + dir + "/port_$RANK.partial && mv " + dir +
                              "/port_$RANK.partial " + dir + "/port_$RANK && sleep 2 && exec " + ALLREDUCE_CHECK_PATH;
  const DdprunProcess job = start_ddprun({"--standalone", "--nproc-per-node", "2", "/bin/sh", "-c", wrapper}, out,
                                         {{"DDP_BACKEND", "gloo"}, {"OMP_NUM_THREADS", "1"}});
  const std::string port_file = dir + "/port_0";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!std::filesystem::exists(port_file) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  int port = 0;
  std::ifstream(port_file) >> port;
  ASSERT_GT(port, 0) << "rank 0 never wrote its MASTER_PORT";
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  const int reuse = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &reuse, sizeof(reuse));
  const bool taken = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  ::close(fd);
  EXPECT_FALSE(taken) << "another process could bind the rendezvous port " << port << " before rank 0's store";
  const DdprunResult result = wait_ddprun(job, std::chrono::seconds(60));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("allreduce_check: rank 1 of 2: sum 3, expected 3: correct"), std::string::npos)
      << result.output;
}

}  // namespace
}  // namespace ddp::launcher::testing
