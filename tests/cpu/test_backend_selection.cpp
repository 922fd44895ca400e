// Backend names, and the errors init() gives before it contacts anyone.

#include <cstdlib>

#include <gtest/gtest.h>

#include <ddp/ddp.h>

namespace {

TEST(Backend, NamesRoundTrip) {
  EXPECT_EQ(ddp::parse_backend("NCCL"), ddp::Backend::kNccl);
  EXPECT_EQ(ddp::parse_backend("gloo"), ddp::Backend::kGloo);
  EXPECT_EQ(ddp::to_string(ddp::Backend::kNccl), "nccl");
  EXPECT_EQ(ddp::to_string(ddp::ReduceOp::kAvg), "avg");
}

TEST(Backend, UnknownNameSaysWhatIsValid) {
  try {
    ddp::parse_backend("mpi");
    FAIL() << "expected a UsageError";
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'mpi'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("'gloo'"), std::string::npos);
  }
}

TEST(Backend, AtLeastOneIsBuilt) {
  EXPECT_TRUE(ddp::is_available(ddp::Backend::kNccl) || ddp::is_available(ddp::Backend::kGloo));
}

class InitErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("RANK", "0", 1);
    ::setenv("WORLD_SIZE", "1", 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", "1", 1);  // never reached: every case fails before the rendezvous
  }
  void TearDown() override {
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DDP_BACKEND",
                             "DDP_COPY_ENGINE_REDUCTIONS"}) {
      ::unsetenv(name);
    }
  }
  static std::string init_error() {
    try {
      ddp::init();
    } catch (const ddp::UsageError& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected a UsageError";
    return {};
  }
};

TEST_F(InitErrors, BadDdpBackendVariableIsNamed) {
  ::setenv("DDP_BACKEND", "infiniband", 1);
  const std::string message = init_error();
  EXPECT_NE(message.find("DDP_BACKEND"), std::string::npos) << message;
  EXPECT_NE(message.find("infiniband"), std::string::npos) << message;
}

TEST_F(InitErrors, MissingBackendOrGpuIsExplained) {
  if (ddp::is_available(ddp::Backend::kNccl)) {
    // Built with NCCL: with no GPU visible, asking for NCCL must say so. (No
    // test of this binary initialises CUDA earlier, so hiding GPUs works.)
    ::setenv("CUDA_VISIBLE_DEVICES", "", 1);
    ::setenv("DDP_BACKEND", "nccl", 1);
    const std::string message = init_error();
    ::unsetenv("CUDA_VISIBLE_DEVICES");
    EXPECT_NE(message.find("needs a GPU"), std::string::npos) << message;
    EXPECT_NE(message.find("DDP_BACKEND=gloo"), std::string::npos) << message;
  } else {
    ::setenv("DDP_BACKEND", "nccl", 1);
    const std::string message = init_error();
    EXPECT_NE(message.find("built without the nccl backend"), std::string::npos) << message;
  }
}

TEST_F(InitErrors, CopyEngineReductionsNeedAOneOrZeroNcclAndOneNode) {
  ::setenv("DDP_COPY_ENGINE_REDUCTIONS", "yes", 1);
  std::string message = init_error();
  EXPECT_NE(message.find("DDP_COPY_ENGINE_REDUCTIONS must be 1 or 0, got 'yes'"), std::string::npos) << message;
  ::setenv("DDP_COPY_ENGINE_REDUCTIONS", "1", 1);
  ::setenv("DDP_BACKEND", "gloo", 1);
  message = init_error();
  EXPECT_NE(message.find("need the NCCL backend"), std::string::npos) << message;
  ::setenv("DDP_BACKEND", "nccl", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  ::setenv("LOCAL_WORLD_SIZE", "2", 1);
  message = init_error();
  EXPECT_NE(message.find("every rank on one node (WORLD_SIZE=4, LOCAL_WORLD_SIZE=2)"), std::string::npos) << message;
}

}  // namespace
