// ddprun --doctor end to end on the CPU: its probe runs as a real 2-rank Gloo job.

#include <gtest/gtest.h>

#include "ddprun_runner.h"

namespace ddp::launcher::testing {
namespace {

TEST(DdprunTwoNodes, DoctorRunsARealJobAndReportsInJson) {
  ScratchDir scratch;
  const DdprunResult result =
      run_ddprun({"--doctor", "--json"}, scratch, {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(120));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  ASSERT_FALSE(result.output.empty());
  EXPECT_EQ(result.output.front(), '{') << "not JSON alone: " << result.output;
  EXPECT_NE(result.output.find("\"ok\": true"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("\"detail\": \"Gloo, 2 ranks, correct; bus bandwidth 1 MiB"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("\"name\": \"libddp build\""), std::string::npos) << result.output;
}

TEST(DdprunTwoNodes, DoctorFailsOnANetworkInterfaceThatDoesNotExist) {
  ScratchDir scratch;
  const DdprunResult result =
      run_ddprun({"--doctor"}, scratch, {{"OMP_NUM_THREADS", "1"}, {"NCCL_SOCKET_IFNAME", "nosuchif0"}},
                 std::chrono::seconds(120));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("failure  NCCL_SOCKET_IFNAME: 'nosuchif0' matches no network interface"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("fix: set NCCL_SOCKET_IFNAME to one of those interfaces"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("1 problem(s) would stop a job"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace ddp::launcher::testing
