// Checkpoints are written atomically, and bad ones are refused by name.

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "support/multiprocess.h"

namespace {

namespace fs = std::filesystem;

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = fs::temp_directory_path() / fmt_dir();
    fs::remove_all(directory_);
  }
  void TearDown() override { fs::remove_all(directory_); }
  static std::string fmt_dir() {
    return "ddp_checkpoint_test_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  std::vector<std::string> files() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(directory_)) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  fs::path directory_;
};

torch::serialize::OutputArchive archive_with(double value) {
  torch::serialize::OutputArchive archive;
  archive.write("value", c10::IValue(value));
  archive.write("tensor", torch::full({1000}, value));
  return archive;
}

double value_in(const std::string& path) {
  torch::serialize::InputArchive archive;
  ddp::checkpoint::load(archive, path);
  c10::IValue value;
  archive.read("value", value);
  return value.toDouble();
}

TEST_F(Checkpoint, SavesAtomicallyAndLeavesNoTemporaryFile) {
  const std::string path = (directory_ / "nested" / "ckpt.pt").string();
  auto first = archive_with(1.0);
  ddp::checkpoint::save(first, path);
  auto second = archive_with(2.0);
  ddp::checkpoint::save(second, path);
  EXPECT_EQ(value_in(path), 2.0);
  EXPECT_EQ(fs::directory_iterator(directory_ / "nested")->path().filename(), "ckpt.pt");
  EXPECT_EQ(std::distance(fs::directory_iterator(directory_ / "nested"), fs::directory_iterator()), 1);
}

TEST_F(Checkpoint, AFailedSaveKeepsThePreviousCheckpoint) {
  const std::string path = (directory_ / "ckpt.pt").string();
  auto good = archive_with(1.0);
  ddp::checkpoint::save(good, path);
  // The rename cannot replace a non-empty directory: the save fails after
  // the temporary file is written.
  const std::string blocked = (directory_ / "blocked.pt").string();
  fs::create_directories(fs::path(blocked) / "occupied");
  auto doomed = archive_with(2.0);
  try {
    ddp::checkpoint::save(doomed, blocked);
    FAIL() << "saving over a directory succeeded";
  } catch (const ddp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rename"), std::string::npos) << e.what();
  }
  EXPECT_EQ(files(), (std::vector<std::string>{"blocked.pt", "ckpt.pt"}));  // no temporary left
  EXPECT_EQ(value_in(path), 1.0);
}

TEST_F(Checkpoint, MissingAndCorruptCheckpointsAreNamed) {
  const std::string missing = (directory_ / "absent.pt").string();
  try {
    torch::serialize::InputArchive archive;
    ddp::checkpoint::load(archive, missing);
    FAIL() << "a missing checkpoint loaded";
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  const std::string path = (directory_ / "ckpt.pt").string();
  auto good = archive_with(1.0);
  ddp::checkpoint::save(good, path);
  fs::resize_file(path, fs::file_size(path) / 2);  // a torn write, as a crash without atomic save leaves
  try {
    torch::serialize::InputArchive archive;
    ddp::checkpoint::load(archive, path);
    FAIL() << "a truncated checkpoint loaded";
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("corrupt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

#ifdef DDP_TEST_WITH_GLOO
TEST(CheckpointGloo, RankZeroSavesAndEveryRankLearnsTheOutcome) {
  using namespace ddp::testing;
  expect_all_succeeded(run_ranks(2, [](int rank) {
    auto pg = ddp::init(ddp::InitOptions().backend(ddp::Backend::kGloo).timeout(std::chrono::seconds(60)));
    // The job's port names a directory every rank agrees on.
    const fs::path directory = fs::temp_directory_path() / ("ddp_checkpoint_job_" + std::string(std::getenv("MASTER_PORT")));
    const std::string path = (directory / "ckpt.pt").string();
    ddp::checkpoint::save_on_rank0(*pg, path, [](torch::serialize::OutputArchive& archive) {
      archive.write("value", c10::IValue(3.0));
    });
    require(value_in(path) == 3.0, "rank " + std::to_string(rank) + " does not see the saved checkpoint");
    bool failed = false;
    try {
      ddp::checkpoint::save_on_rank0(*pg, path, [](torch::serialize::OutputArchive&) {
        throw std::runtime_error("disk full");
      });
    } catch (const ddp::Error& e) {
      failed = true;
      require(rank == 0 ? std::string(e.what()) == "disk full"
                        : std::string(e.what()).find("rank 0 failed") != std::string::npos,
              std::string("unexpected message: ") + e.what());
    }
    require(failed, "rank " + std::to_string(rank) + " did not learn that the save failed");
    require(value_in(path) == 3.0, "the failed save damaged the checkpoint");
    pg->communicator().barrier();
    if (rank == 0) fs::remove_all(directory);
  }));
}
#endif

}  // namespace
