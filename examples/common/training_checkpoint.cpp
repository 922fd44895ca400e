#include "training_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/serialize/archive.h>

#include <ddp/checkpoint.h>
#include <ddp/errors.h>

namespace examples {
namespace {

// 2: the optimizer's state by parameter name (save_optimizer_state), in every sharding mode.
constexpr std::int64_t kFormatVersion = 2;

/// This rank's generators: the CPU one and, on a GPU, the device's.
std::vector<at::Generator> generators(const c10::Device& device) {
  std::vector<at::Generator> list{at::globalContext().defaultGenerator(c10::Device(c10::kCPU))};
  if (device.is_cuda()) list.push_back(at::globalContext().defaultGenerator(device));
  return list;
}

at::Tensor generator_state(const c10::Device& device) {
  std::vector<at::Tensor> states;
  for (auto& generator : generators(device)) states.push_back(generator.get_state());
  return at::cat(states);
}

void set_generator_state(const c10::Device& device, const at::Tensor& state) {
  int64_t offset = 0;
  for (auto& generator : generators(device)) {
    const int64_t size = generator.get_state().numel();
    generator.set_state(state.narrow(0, offset, size).clone());
    offset += size;
  }
}

c10::IValue read(torch::serialize::InputArchive& archive, const std::string& path, const char* key) {
  c10::IValue value;
  if (!archive.try_read(key, value)) {
    throw ddp::UsageError(fmt::format("checkpoint '{}' has no '{}': it is not a training checkpoint of these examples",
                                      path, key));
  }
  return value;
}

/// What a checkpoint holds besides the model and its optimizer: the run.
void write_run_state(torch::serialize::OutputArchive& archive, const TrainingState& state,
                     const at::Tensor& generator_states, const ddp::GradScaler& scaler) {
  archive.write("format_version", c10::IValue(kFormatVersion));
  archive.write("fingerprint", c10::IValue(state.fingerprint));
  archive.write("step", c10::IValue(state.step));
  archive.write("data_position", c10::IValue(state.data_position));
  archive.write("generator_states", generator_states);
  torch::serialize::OutputArchive scaler_archive;
  scaler.save(scaler_archive);
  archive.write("scaler", scaler_archive);
}

/// Reads what write_run_state() wrote; returns every rank's generator states.
at::Tensor read_run_state(torch::serialize::InputArchive& archive, const std::string& path, TrainingState& state,
                          ddp::GradScaler& scaler) {
  const std::int64_t version = read(archive, path, "format_version").toInt();
  if (version != kFormatVersion) {
    throw ddp::UsageError(fmt::format("checkpoint '{}' has format version {}; this program reads version {}", path,
                                      version, kFormatVersion));
  }
  const std::string fingerprint = read(archive, path, "fingerprint").toStringRef();
  if (fingerprint != state.fingerprint) {
    throw ddp::UsageError(fmt::format("checkpoint '{}' belongs to another run and cannot be resumed here:\n"
                                      "  checkpoint: {}\n  this run:   {}\n"
                                      "Resume with the same flags and number of ranks, or start a new run",
                                      path, fingerprint, state.fingerprint));
  }
  state.step = read(archive, path, "step").toInt();
  state.data_position = read(archive, path, "data_position").toIntVector();
  at::Tensor all_states;
  archive.read("generator_states", all_states);
  torch::serialize::InputArchive scaler_archive;
  archive.read("scaler", scaler_archive);
  scaler.load(scaler_archive);
  return all_states;
}

}  // namespace

bool checkpoint_exists(const std::string& path, CheckpointFormat format) {
  const bool sharded = ddp::checkpoint::is_sharded_checkpoint(path);
  // The other format's checkpoint is no reason to start afresh (and overwrite it at the first save).
  if (format == CheckpointFormat::kSharded && std::filesystem::is_regular_file(path)) {
    throw ddp::UsageError(fmt::format(
        "--checkpoint {} holds a whole checkpoint (one file); resume it with --checkpoint-format whole", path));
  }
  if (format == CheckpointFormat::kWhole && sharded) {
    throw ddp::UsageError(fmt::format(
        "--checkpoint {} holds a sharded checkpoint (a folder); resume it with --checkpoint-format sharded", path));
  }
  return format == CheckpointFormat::kSharded ? sharded : std::filesystem::exists(path);
}

void save_training_checkpoint(ddp::ProcessGroup& process_group, const std::string& path, CheckpointFormat format,
                              const ModelCheckpointing& model, const ddp::GradScaler& scaler,
                              const TrainingState& state) {
  // Generator states have the same size on every rank (same generator kinds).
  const at::Tensor mine = generator_state(process_group.device()).to(process_group.device());
  at::Tensor all = at::empty({process_group.world_size() * mine.numel()}, mine.options());
  process_group.communicator().all_gather(all, mine)->wait();
  const at::Tensor all_on_host = all.cpu().view({process_group.world_size(), -1});
  const auto write_run = [&](torch::serialize::OutputArchive& archive) {
    write_run_state(archive, state, all_on_host, scaler);
  };
  if (format == CheckpointFormat::kSharded) {
    model.save_sharded(path, write_run);
    return;
  }
  torch::serialize::OutputArchive model_archive, optimizer_archive;
  model.save(model_archive, optimizer_archive);
  ddp::checkpoint::save_on_rank0(process_group, path, [&](torch::serialize::OutputArchive& archive) {
    write_run(archive);
    archive.write("model", model_archive);
    archive.write("optimizer", optimizer_archive);
  });
}

void load_training_checkpoint(ddp::ProcessGroup& process_group, const std::string& path, CheckpointFormat format,
                              const ModelCheckpointing& model, ddp::GradScaler& scaler, TrainingState& state) {
  at::Tensor all_states;
  if (format == CheckpointFormat::kSharded) {
    model.load_sharded(path, [&](torch::serialize::InputArchive& archive) {
      all_states = read_run_state(archive, path, state, scaler);
    });
  } else {
    torch::serialize::InputArchive archive;
    ddp::checkpoint::load(archive, path);
    all_states = read_run_state(archive, path, state, scaler);
    torch::serialize::InputArchive model_archive, optimizer_archive;
    archive.read("model", model_archive);
    archive.read("optimizer", optimizer_archive);
    model.load(model_archive, optimizer_archive);
  }
  set_generator_state(process_group.device(), all_states[process_group.rank()]);
}

namespace {

/// Why the saves could not write `path`, or "".
std::string unwritable(const std::string& path, CheckpointFormat format, int rank) {
  namespace fs = std::filesystem;
  const bool sharded = format == CheckpointFormat::kSharded;
  if (!sharded && fs::is_directory(path)) {
    return fmt::format(
        "--checkpoint {} is a folder; a whole checkpoint is one file (or use --checkpoint-format "
        "sharded)",
        path);
  }
  if (sharded && fs::exists(path) && !fs::is_directory(path)) {
    return fmt::format("--checkpoint {} is a file; a sharded checkpoint is a folder", path);
  }
  const fs::path folder = sharded                            ? fs::path(path)
                          : fs::path(path).has_parent_path() ? fs::path(path).parent_path()
                                                             : fs::path(".");
  std::error_code error;
  fs::create_directories(folder, error);
  if (error)
    return fmt::format("--checkpoint {}: cannot create the folder {}: {}", path, folder.string(), error.message());
  const fs::path probe = folder / fmt::format(".write-probe.rank{}.{}", rank, ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return fmt::format("--checkpoint {}: cannot write in {}: {}", path, folder.string(), std::strerror(errno));
  ::close(fd);
  fs::remove(probe, error);
  return "";
}

}  // namespace

void check_checkpoint_writable(ddp::ProcessGroup& process_group, const std::string& path, CheckpointFormat format) {
  const bool writes = format == CheckpointFormat::kSharded || process_group.rank() == 0;
  const std::string problem = writes ? unwritable(path, format, process_group.rank()) : "";
  at::Tensor failed =
      at::full({1}, problem.empty() ? 0 : 1, at::TensorOptions().dtype(at::kLong).device(process_group.device()));
  process_group.communicator().all_reduce(failed, ddp::ReduceOp::kMax)->wait();
  if (!problem.empty()) throw ddp::UsageError(problem);
  if (failed.item<std::int64_t>() != 0) {
    throw ddp::UsageError(fmt::format("--checkpoint {}: another rank cannot write it (see its error)", path));
  }
}

}  // namespace examples
