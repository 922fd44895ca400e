#include <ddp/checkpoint.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/serialize/archive.h>

#include <ddp/errors.h>
#include <ddp/process_group.h>

#include "checkpoint/checksum.h"

namespace ddp::checkpoint {
namespace {

/// Opens `path` and fsyncs it; throws naming the call. Directories too: a
/// rename is durable only once its directory is flushed.
void sync_to_disk(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw Error(fmt::format("checkpoint: open('{}') failed: {}", path, std::strerror(errno)));
  const int result = ::fsync(fd);
  const int saved_errno = errno;
  ::close(fd);
  if (result != 0) throw Error(fmt::format("checkpoint: fsync('{}') failed: {}", path, std::strerror(saved_errno)));
}

/// Removes what an interrupted save of `target` left: `<target>.tmp.<pid>` files.
void remove_partial_files(const std::filesystem::path& target) {
  std::error_code error;
  const std::string prefix = target.filename().string() + ".tmp.";
  const std::filesystem::path directory = target.has_parent_path() ? target.parent_path() : ".";
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) std::filesystem::remove(entry.path(), error);
  }
}

}  // namespace

void save(torch::serialize::OutputArchive& archive, const std::string& path) {
  const std::filesystem::path target(path);
  const std::filesystem::path directory = target.has_parent_path() ? target.parent_path() : ".";
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) throw Error(fmt::format("checkpoint: cannot create directory '{}': {}", directory.string(), error.message()));
  remove_partial_files(target);
  // Same directory as the target, so that rename() is atomic (one filesystem).
  const std::string temporary = fmt::format("{}.tmp.{}", path, ::getpid());
  try {
    archive.save_to(temporary);
    detail::seal_file(temporary);
    sync_to_disk(temporary, /*directory=*/false);
    if (::rename(temporary.c_str(), path.c_str()) != 0) {
      throw Error(fmt::format("checkpoint: rename('{}', '{}') failed: {}", temporary, path, std::strerror(errno)));
    }
  } catch (const Error&) {
    std::filesystem::remove(temporary, error);
    throw;
  } catch (const std::exception& e) {
    std::filesystem::remove(temporary, error);
    throw Error(fmt::format("checkpoint: writing '{}' failed: {}", temporary, e.what()));
  }
  sync_to_disk(directory.string(), /*directory=*/true);
}

void load(torch::serialize::InputArchive& archive, const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) {
    throw UsageError(fmt::format("checkpoint '{}' does not exist (or is not a file); check the path, or start "
                                 "without resuming",
                                 path));
  }
  detail::verify_seal(path);
  try {
    archive.load_from(path);
  } catch (const std::exception& e) {
    throw UsageError(
        fmt::format("checkpoint '{}' cannot be read: it is truncated, corrupt or not a libddp "
                    "checkpoint ({})",
                    path, first_line_of(e)));
  }
}

void save_on_rank0(ProcessGroup& process_group, const std::string& path,
                   const std::function<void(torch::serialize::OutputArchive&)>& write) {
  std::string failure;
  if (process_group.rank() == 0) {
    try {
      torch::serialize::OutputArchive archive;
      write(archive);
      save(archive, path);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  // Rank 0 tells the others whether the checkpoint exists: a flag all-reduce,
  // not just a barrier, so that no rank goes on believing it was saved.
  at::Tensor failed = at::full({1}, failure.empty() ? 0 : 1,
                               at::TensorOptions().dtype(at::kInt).device(process_group.device()));
  process_group.communicator().all_reduce(failed, ReduceOp::kMax)->wait();
  if (!failure.empty()) throw Error(failure);
  if (failed.item<int>() != 0) throw Error(fmt::format("checkpoint '{}': rank 0 failed to save it", path));
}

}  // namespace ddp::checkpoint
