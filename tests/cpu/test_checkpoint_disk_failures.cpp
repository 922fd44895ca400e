// What a sharded save leaves when the disk fails under it. This binary
// defines fsync(), so that libddp's calls come here: a directory's flush can
// be made to fail with EIO, before the manifest commits the save or after.

#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "support/collective_checks.h"
#include "support/multiprocess.h"
#include "support/remove_tree.h"

namespace {

/// The directory flush that fails next, counting from 1; 0: none.
int failing_directory_flush = 0;
int directory_flushes = 0;

}  // namespace

extern "C" int fsync(int fd) {
  struct stat status {};
  if (failing_directory_flush > 0 && ::fstat(fd, &status) == 0 && S_ISDIR(status.st_mode) &&
      ++directory_flushes == failing_directory_flush) {
    errno = EIO;
    return -1;
  }
  return static_cast<int>(::syscall(SYS_fsync, fd));
}

namespace {

using namespace ddp::testing;

std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const ddp::Error& e) {
    return e.what();
  }
  throw std::runtime_error("the save succeeded although a directory flush failed");
}

/// A sharded save flushes the directory twice: after its rank file (1), and
/// after the manifest that commits it (2).
class ShardedSaveDiskFailure : public ::testing::TestWithParam<int> {};

TEST_P(ShardedSaveDiskFailure, LeavesOneLoadableCheckpointAndNoOrphans) {
  const int failing_flush = GetParam();
  expect_all_succeeded(run_ranks(1, [failing_flush](int) {
    namespace fs = std::filesystem;
    const fs::path directory = fs::temp_directory_path() / ("ddp_sharded_eio_" + std::to_string(::getpid()));
    auto pg = ddp::init(ddp::InitOptions().backend(ddp::Backend::kGloo));
    const auto options = ddp::DistributedDataParallelOptions().sharding(ddp::Sharding::kGradients);
    auto model = ddp::DistributedDataParallel<torch::nn::Linear>(torch::nn::Linear(4, 3), pg, options);
    torch::optim::AdamW adamw(model.parameters());
    auto step = [&] {
      adamw.zero_grad();
      model(torch::ones({2, 4})).sum().backward();
      adamw.step();
      return model.module()->weight.detach().clone();
    };
    const at::Tensor first = step();
    model.save_sharded_checkpoint(directory.string(), &adamw);
    const at::Tensor second = step();

    failing_directory_flush = failing_flush;
    directory_flushes = 0;
    require_contains(error_of([&] { model.save_sharded_checkpoint(directory.string(), &adamw); }),
                     "fsync");
    failing_directory_flush = 0;
    require(directory_flushes == failing_flush, "the save flushed its directory " +
                                                    std::to_string(directory_flushes) + " times before failing");

    // Before the commit, the previous checkpoint stands; after it, the new one.
    const bool committed = failing_flush == 2;
    std::size_t files = 0;
    for ([[maybe_unused]] const auto& entry : fs::directory_iterator(directory)) ++files;
    require(files == (committed ? 3 : 2), "the failed save left " + std::to_string(files) +
                                              " files: " + (committed ? "expected the manifest, its rank file and "
                                                                        "the previous one's"
                                                                      : "expected the manifest and one rank file"));
    step();
    model.load_sharded_checkpoint(directory.string(), &adamw);
    require(at::equal(model.module()->weight, committed ? second : first),
            committed ? "the committed checkpoint does not hold the weights of the failed save"
                      : "the previous checkpoint does not hold its own weights");
    remove_tree(directory);
  }));
}

INSTANTIATE_TEST_SUITE_P(Flush, ShardedSaveDiskFailure, ::testing::Values(1, 2), [](const auto& info) {
  return info.param == 1 ? "BeforeTheManifest" : "AfterTheManifest";
});

}  // namespace
