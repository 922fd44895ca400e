// Checkpoints are written atomically, and bad ones are refused by name.

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "checkpoint/checksum.h"
#include "support/multiprocess.h"
#include "support/remove_tree.h"

namespace {

namespace fs = std::filesystem;

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = fs::temp_directory_path() / fmt_dir();
    ddp::testing::remove_tree(directory_);
  }
  void TearDown() override { ddp::testing::remove_tree(directory_); }
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

// XXH64 as its reference implementation computes it (python-xxhash 3.x),
// whole and fed in pieces of every size.
TEST(Checksum, Xxh64MatchesTheReference) {
  const auto of = [](const std::string& bytes) {
    ddp::detail::Xxh64 hash;
    hash.update(bytes.data(), bytes.size());
    return hash.digest();
  };
  EXPECT_EQ(of(""), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(of("a"), 0xD24EC4F1A98C6E5BULL);
  EXPECT_EQ(of("abc"), 0x44BC2CF5AD770999ULL);
  std::string pattern;
  for (int i = 0; i < 1000; ++i) pattern.push_back(static_cast<char>((i * 31 + 7) % 251));
  EXPECT_EQ(of(pattern), 0x9E3300C1CDE3C58DULL);
  for (std::size_t piece : {1, 3, 7, 31, 32, 33, 100}) {
    ddp::detail::Xxh64 hash;
    for (std::size_t at = 0; at < pattern.size(); at += piece) {
      hash.update(pattern.data() + at, std::min(piece, pattern.size() - at));
    }
    EXPECT_EQ(hash.digest(), 0x9E3300C1CDE3C58DULL) << "pieces of " << piece;
  }
}

// Eight flipped bytes anywhere in a real checkpoint (a module, optimizer
// state, metadata: every record of its zip) are refused with one clear line;
// LibTorch's reader alone accepted such a file and training went on with NaNs.
TEST_F(Checkpoint, FlippedBytesAnywhereAreRefused) {
  const std::string path = (directory_ / "ckpt.pt").string();
  torch::nn::Sequential model(torch::nn::Linear(64, 64), torch::nn::ReLU(), torch::nn::Linear(64, 8));
  torch::optim::AdamW optimizer(model->parameters());
  model->forward(torch::ones({2, 64})).sum().backward();
  optimizer.step();
  torch::serialize::OutputArchive archive, module_archive, optimizer_archive;
  model->save(module_archive);
  optimizer.save(optimizer_archive);
  archive.write("model", module_archive);
  archive.write("optimizer", optimizer_archive);
  archive.write("step", c10::IValue(static_cast<std::int64_t>(7)));
  ddp::checkpoint::save(archive, path);
  std::string original;
  {
    std::ifstream in(path, std::ios::binary);
    original.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::size_t data = original.size() - 32;  // the seal is the last 32 bytes
  int refused = 0, tries = 0;
  for (std::size_t at = 0; at + 8 <= data; at += data / 97) {
    std::string damaged = original;
    for (std::size_t i = at; i < at + 8; ++i) damaged[i] = static_cast<char>(~damaged[i]);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << damaged;
    ++tries;
    try {
      torch::serialize::InputArchive loaded;
      ddp::checkpoint::load(loaded, path);
    } catch (const ddp::UsageError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("is damaged"), std::string::npos) << "flipped at " << at << ": " << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      ++refused;
    }
  }
  EXPECT_EQ(refused, tries);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << original;
  torch::serialize::InputArchive intact;
  ddp::checkpoint::load(intact, path);  // the seal itself does not disturb LibTorch's reader
}

// What an interrupted save left beside the checkpoint goes at the next save.
TEST_F(Checkpoint, PartialFilesOfAnInterruptedSaveAreRemoved) {
  const std::string path = (directory_ / "ckpt.pt").string();
  fs::create_directories(directory_);
  std::ofstream(path + ".tmp.12345") << "half a checkpoint";
  std::ofstream(directory_ / "other.pt.tmp.12345") << "another file's";
  auto archive = archive_with(3.0);
  ddp::checkpoint::save(archive, path);
  EXPECT_EQ(files(), (std::vector<std::string>{"ckpt.pt", "other.pt.tmp.12345"}));
  EXPECT_EQ(value_in(path), 3.0);
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
    if (rank == 0) ddp::testing::remove_tree(directory);
  }));
}
#endif

}  // namespace
