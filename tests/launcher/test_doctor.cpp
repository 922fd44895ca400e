// ddprun --doctor's host checks on made-up machines, and its report.

#include <gtest/gtest.h>

#include "launcher/doctor.h"
#include "launcher/doctor_checks.h"

namespace ddp::launcher {
namespace {

constexpr std::int64_t kMiB = 1 << 20;

/// Two GPUs, a roomy /dev/shm, lo and eth0, no InfiniBand.
HostFacts healthy() {
  HostFacts facts;
  facts.gpu_models = {"NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"};
  facts.gpu_uuids = {"GPU-aaaa-1111", "GPU-bbbb-2222"};
  facts.driver_version = "570.86.15";
  facts.shm_bytes = facts.shm_free_bytes = 16 * 1024 * kMiB;
  facts.interfaces = {"eth0", "lo"};
  facts.hostname = "node1";
  return facts;
}

/// A copy: g++ 13 takes a reference returned next to a temporary name for a dangling one.
Check find(const std::vector<Check>& checks, const std::string& name) {
  for (const Check& check : checks) {
    if (check.name == name) return check;
  }
  throw std::runtime_error("no check named " + name);
}

int failures(const std::vector<Check>& checks) {
  int count = 0;
  for (const Check& check : checks) count += check.status == CheckStatus::kFailure;
  return count;
}

TEST(DoctorChecks, AHealthyMachineHasNoFailures) {
  const auto checks = host_checks(healthy());
  EXPECT_EQ(failures(checks), 0) << render_report(checks, false);
  EXPECT_EQ(find(checks, "GPUs").detail, "2 x NVIDIA H100 80GB HBM3, driver 570.86.15");
}

// Docker's default /dev/shm (64 MiB) stops NCCL between local GPUs.
TEST(DoctorChecks, ATinySharedMemoryIsAFailureWithTheFix) {
  HostFacts facts = healthy();
  facts.shm_bytes = facts.shm_free_bytes = 64 * kMiB;
  const Check shm = find(host_checks(facts), "/dev/shm");
  EXPECT_EQ(shm.status, CheckStatus::kFailure);
  EXPECT_NE(shm.fix.find("--ipc=host"), std::string::npos);
  facts.gpu_models.resize(1);  // one GPU: no NCCL traffic between local ranks
  EXPECT_EQ(find(host_checks(facts), "/dev/shm").status, CheckStatus::kOk);
}

TEST(DoctorChecks, CudaVisibleDevicesMustNameGpusThatExistOnce) {
  HostFacts facts = healthy();
  for (const auto& [value, ok] : std::vector<std::pair<std::string, bool>>{{"0,1", true},
                                                                           {"1", true},
                                                                           {"GPU-bbbb", true},
                                                                           {"2", false},
                                                                           {"0,0", false},
                                                                           {"GPU-cccc", false},
                                                                           {"x", false}}) {
    facts.env["CUDA_VISIBLE_DEVICES"] = value;
    const Check check = find(host_checks(facts), "CUDA_VISIBLE_DEVICES");
    EXPECT_EQ(check.status == CheckStatus::kOk, ok) << value << ": " << check.detail;
    if (!ok) {
      EXPECT_NE(check.fix.find("nvidia-smi -L"), std::string::npos);
    }
  }
  facts.env["CUDA_VISIBLE_DEVICES"] = "";
  EXPECT_EQ(find(host_checks(facts), "CUDA_VISIBLE_DEVICES").status, CheckStatus::kWarning);
}

// NCCL takes prefixes, "=name" exactly and "^..." to exclude; Gloo whole names.
TEST(DoctorChecks, SocketInterfacesMustMatchOneOfTheHosts) {
  HostFacts facts = healthy();
  for (const auto& [value, ok] : std::vector<std::pair<std::string, bool>>{
           {"eth", true}, {"=eth0", true}, {"^lo", true}, {"ib", false}, {"=eth", false}, {"^eth,lo", false}}) {
    facts.env["NCCL_SOCKET_IFNAME"] = value;
    const Check check = find(host_checks(facts), "NCCL_SOCKET_IFNAME");
    EXPECT_EQ(check.status == CheckStatus::kOk, ok) << value << ": " << check.detail;
    if (!ok) {
      EXPECT_NE(check.detail.find("eth0, lo"), std::string::npos) << check.detail;
    }
  }
  facts.env.erase("NCCL_SOCKET_IFNAME");
  facts.env["GLOO_SOCKET_IFNAME"] = "eth";
  EXPECT_EQ(find(host_checks(facts), "GLOO_SOCKET_IFNAME").status, CheckStatus::kFailure);
  facts.env["GLOO_SOCKET_IFNAME"] = "eth0";
  EXPECT_EQ(find(host_checks(facts), "GLOO_SOCKET_IFNAME").status, CheckStatus::kOk);
}

TEST(DoctorChecks, AnInfinibandAdapterNamedButAbsentAndAnUnresolvableHostAreFailures) {
  HostFacts facts = healthy();
  facts.env["NCCL_IB_HCA"] = "mlx5_0";
  EXPECT_EQ(find(host_checks(facts), "InfiniBand").status, CheckStatus::kFailure);
  facts.ib_devices = {"mlx5_0"};
  EXPECT_EQ(find(host_checks(facts), "InfiniBand").status, CheckStatus::kOk);
  facts.hostname_resolves = false;
  EXPECT_EQ(find(host_checks(facts), "host name").status, CheckStatus::kFailure);
}

TEST(DoctorChecks, SlowingSettingsAreWarningsAndTheSecretIsNotShown) {
  HostFacts facts = healthy();
  facts.env = {{"NCCL_P2P_DISABLE", "1"}, {"DDP_RDZV_TOKEN", "secret"}, {"HOME", "/root"}};
  const auto checks = host_checks(facts);
  EXPECT_EQ(find(checks, "NCCL_P2P_DISABLE").status, CheckStatus::kWarning);
  const std::string listed = find(checks, "variables in effect").detail;
  EXPECT_NE(listed.find("NCCL_P2P_DISABLE=1"), std::string::npos);
  EXPECT_EQ(listed.find("secret"), std::string::npos);
  EXPECT_EQ(listed.find("HOME"), std::string::npos);
}

TEST(DoctorChecks, TheDriverVersionIsReadFromBothKernelModulesBanners) {
  EXPECT_EQ(driver_version_of("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Fri Jan 10 2025"),
            "570.86.15");
  EXPECT_EQ(driver_version_of("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build"),
            "580.95.05");
  EXPECT_EQ(driver_version_of(""), "");
}

TEST(DoctorReport, ProbeLinesParseAndTheJsonCountsAndEscapes) {
  const auto probe =
      parse_probe_report("ok\tall-reduce\tGloo, 2 ranks\t\nfailure\tCUDA driver\ttoo \"old\"\tupdate it\n");
  ASSERT_EQ(probe.size(), 2u);
  EXPECT_EQ(probe[1].status, CheckStatus::kFailure);
  EXPECT_EQ(probe[1].fix, "update it");
  const std::string json = render_report(probe, true);
  EXPECT_NE(json.find("\"ok\": false, \"failures\": 1, \"warnings\": 0"), std::string::npos) << json;
  EXPECT_NE(json.find("too \\\"old\\\""), std::string::npos) << json;
  const std::string text = render_report(probe, false);
  EXPECT_NE(text.find("fix: update it"), std::string::npos) << text;
  EXPECT_NE(text.find("1 problem(s) would stop a job"), std::string::npos) << text;
}

}  // namespace
}  // namespace ddp::launcher
