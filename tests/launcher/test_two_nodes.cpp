// Two ddprun instances as two nodes on loopback form one 4-rank Gloo job.

#include <gtest/gtest.h>

#include "ddprun_runner.h"
#include "launcher/ports.h"

namespace ddp::launcher::testing {
namespace {

TEST(DdprunTwoNodes, FormOneGlooJobThatAllReducesCorrectly) {
  const std::string port = std::to_string(free_port());
  const EnvChanges env = {{"DDP_BACKEND", "gloo"}, {"OMP_NUM_THREADS", "1"}};
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

}  // namespace
}  // namespace ddp::launcher::testing
