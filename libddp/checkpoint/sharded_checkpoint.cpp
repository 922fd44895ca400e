#include "checkpoint/sharded_checkpoint.h"

#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <unordered_set>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <ddp/checkpoint.h>
#include <ddp/errors.h>
#include <ddp/float8.h>
#include <ddp/optim.h>

#include "checkpoint/archive_entry.h"
#include "checkpoint/optimizer_param_state.h"
#include "float8/linear_state.h"
#include "reducer/row_major.h"
#include "sharding/sharded_parameters.h"

namespace ddp::detail {
namespace {

constexpr std::int64_t kFormat = 1;
constexpr const char* kManifest = "manifest.pt";

/// A run of one parameter's elements, in its flat layout (flat_layout_strides), held by one rank.
struct Piece {
  std::size_t parameter;
  std::int64_t begin;
  std::int64_t length;
};

std::string rank_file(const std::string& id, int rank) { return fmt::format("{}.rank{}.pt", id, rank); }

// What a parameter is trained and saved in (a kFull unit may be gathered in a narrower dtype).
at::ScalarType trained_dtype(const CheckpointedModel& model, std::size_t index) {
  return model.sharded != nullptr ? model.sharded->trained_dtype(index) : model.trained[index].scalar_type();
}

/// Refuses a tensor the checkpoint holds in another dtype than the model's.
void require_same_dtype(const std::string& directory, const std::string& name, const std::string& saved,
                        const std::string& model) {
  if (saved != model) {
    throw UsageError(fmt::format(
        "sharded checkpoint '{}' holds '{}' in {}, the model's is {}; convert the model to {} before loading",
        directory, name, saved, model, saved));
  }
}

std::string path_in(const std::string& directory, const std::string& file) {
  return (std::filesystem::path(directory) / file).string();
}

/// What `rank` writes: the fragments it steps, or without sharding an equal
/// split of each parameter, so that every rank writes its share.
std::vector<Piece> pieces_of(const CheckpointedModel& model, int rank, int world_size) {
  std::vector<Piece> pieces;
  if (model.sharded == nullptr) {
    for (std::size_t i = 0; i < model.trained.size(); ++i) {
      const std::int64_t numel = model.trained[i].numel();
      const std::int64_t begin = numel * rank / world_size;
      const std::int64_t end = numel * (rank + 1) / world_size;
      if (end > begin) pieces.push_back({i, begin, end - begin});
    }
    return pieces;
  }
  for (std::size_t b = 0; b < model.sharded->bucket_count(); ++b) {
    const ShardLayout& layout = model.sharded->layout(b);
    for (const auto& part : layout.fragments(rank)) {
      pieces.push_back(
          {model.sharded->bucket_parameters(b)[part.slot], part.begin - layout.offsets[part.slot], part.length});
    }
  }
  return pieces;
}

/// `tensor`'s elements in the order of `strides` as a flat tensor: an alias
/// where `tensor` is laid out so, else a laid-out copy.
at::Tensor flat_in_layout(const at::Tensor& tensor, c10::IntArrayRef strides) {
  at::Tensor laid_out = tensor;
  if (!tensor.is_non_overlapping_and_dense() ||
      !same_strides_where_addressed(tensor.sizes(), tensor.strides(), strides)) {
    laid_out = at::empty_strided(tensor.sizes(), strides, tensor.options()).copy_(tensor);
  }
  return alias(laid_out, 0, {laid_out.numel()}, {1});
}

/// A host copy with storage of its own: an archive writes a view's whole storage.
at::Tensor host_copy(const at::Tensor& tensor) { return tensor.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true); }

/// Copies into `destination` (elements [destination_begin, ...) of a
/// parameter) the elements of `source` (from source_begin on) that it
/// covers; returns how many.
std::int64_t copy_overlap(const at::Tensor& destination, std::int64_t destination_begin, const at::Tensor& source,
                          std::int64_t source_begin) {
  const std::int64_t begin = std::max(destination_begin, source_begin);
  const std::int64_t end = std::min(destination_begin + destination.numel(), source_begin + source.numel());
  if (end <= begin) return 0;
  destination.narrow(0, begin - destination_begin, end - begin)
      .copy_(source.reshape({-1}).narrow(0, begin - source_begin, end - begin));
  return end - begin;
}

/// The module's tensors every rank holds whole: buffers and frozen parameters, by name.
std::vector<std::pair<std::string, at::Tensor>> replicated_tensors(const CheckpointedModel& model) {
  std::unordered_set<const c10::TensorImpl*> skip;
  for (const at::Tensor& parameter : model.trained) skip.insert(parameter.unsafeGetTensorImpl());
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& item : model.module.named_parameters()) {
    if (skip.insert(item.value().unsafeGetTensorImpl()).second) tensors.emplace_back(item.key(), item.value());
  }
  for (const auto& item : model.module.named_buffers()) tensors.emplace_back(item.key(), item.value());
  return tensors;
}

/// The delayed-scaling state of the model's Float8Linear layers (amax
/// histories and scales), which each rank holds whole, as Module::save
/// writes it for one layer: an entry per layer that has such state.
torch::serialize::OutputArchive float8_scalings(const CheckpointedModel& model) {
  torch::serialize::OutputArchive layers;
  std::int64_t count = 0;
  for (const auto& item : model.module.named_modules()) {
    const auto* layer = dynamic_cast<const Float8LinearImpl*>(item.value().get());
    torch::serialize::OutputArchive scaling;
    if (layer == nullptr || !Float8LinearAccess::save_scaling(*layer, scaling)) continue;
    torch::serialize::OutputArchive entry;
    entry.write("name", c10::IValue(item.key()));
    entry.write("state", scaling);
    layers.write(fmt::format("l{}", count++), entry);
  }
  layers.write("count", c10::IValue(count));
  return layers;
}

/// Every rank's `value`, or -1 for a rank that failed; this rank's own
/// failure is rethrown as it was, another's named. Collective.
std::vector<std::int64_t> agree(Communicator& comm, std::int64_t value, const std::exception_ptr& failure,
                                const std::string& what) {
  const auto options = at::TensorOptions().dtype(at::kLong).device(comm.device());
  at::Tensor all = at::empty({comm.world_size()}, options);
  comm.all_gather(all, at::full({1}, failure ? -1 : value, options))->wait();
  if (failure) std::rethrow_exception(failure);
  all = all.cpu();
  std::vector<std::int64_t> values(all.data_ptr<std::int64_t>(), all.data_ptr<std::int64_t>() + all.numel());
  std::vector<int> failed;
  for (int rank = 0; rank < comm.world_size(); ++rank) {
    if (values[rank] < 0) failed.push_back(rank);
  }
  if (!failed.empty()) {
    throw Error(fmt::format("{} failed on rank {} (see that rank's error)", what, fmt::join(failed, ", ")));
  }
  return values;
}

/// Entry `key` of the file at `path`: an IValue, a tensor or a nested archive.
template <typename Value = c10::IValue>
Value read(torch::serialize::InputArchive& archive, const std::string& path, const std::string& key) {
  Value value;
  read_entry(archive, key, value, fmt::format("sharded checkpoint file '{}'", path));
  return value;
}

/// Calls `visit(k, name, entry)` for each entry "<prefix><k>" of a manifest
/// list whose length is stored under `count_key`.
void for_each_entry(
    torch::serialize::InputArchive& list, const std::string& path, const std::string& count_key,
    const std::string& prefix,
    const std::function<void(std::int64_t, const std::string&, torch::serialize::InputArchive&)>& visit) {
  const std::int64_t count = read(list, path, count_key).toInt();
  for (std::int64_t k = 0; k < count; ++k) {
    auto entry = read<torch::serialize::InputArchive>(list, path, prefix + std::to_string(k));
    visit(k, read(entry, path, "name").toStringRef(), entry);
  }
}

/// Removes the files of earlier checkpoints in `directory` (and what an
/// interrupted save left of them), once `id`'s manifest is committed.
void remove_stale_files(const std::string& directory, const std::string& id) {
  static const std::regex pattern("([0-9a-f]{16})\\.rank[0-9]+\\.pt(\\.tmp\\.[0-9]+)?");
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    std::smatch match;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, match, pattern) && match[1] != id) std::filesystem::remove(entry.path(), error);
  }
}

/// Whether `directory` surely holds no manifest that commits the save `id`:
/// none, or one of another save. One that cannot be read (the disk failing
/// under the save, a filesystem that shows the rename late) might.
bool surely_uncommitted(const std::string& directory, const std::string& id) {
  const std::string manifest_path = path_in(directory, kManifest);
  if (!std::filesystem::exists(manifest_path)) return true;
  try {
    torch::serialize::InputArchive manifest;
    checkpoint::load(manifest, manifest_path);
    return read(manifest, manifest_path, "id").toStringRef() != id;
  } catch (const std::exception&) {
    return false;
  }
}

/// One saved parameter, as the manifest describes it.
struct SavedParameter {
  std::int64_t entry = 0;  ///< Its key in the rank files: "p<entry>".
  std::int64_t step = -1;
  std::vector<std::int64_t> ranks, begins, lengths;  ///< Its pieces.
};

/// What this rank reads of one parameter, and where the values go.
struct Destination {
  std::size_t parameter;
  std::int64_t begin = 0;
  at::Tensor value;     ///< Flat: the fragment, or an alias of the parameter's memory.
  at::Tensor laid_out;  ///< Without sharding: the parameter's values laid out flat, if that took a copy.
  std::map<std::string, at::Tensor> state;       ///< The optimizer state to install.
  std::map<std::string, at::Tensor> flat_state;  ///< Flat aliases of `state`, written from the files.
};

/// One Float8Linear layer's saved scaling state, matched to the model's layer.
struct SavedFloat8Scaling {
  Float8LinearImpl* layer;
  std::string name;
  torch::serialize::InputArchive state;
};

/// What float8_scalings() wrote into the manifest, matched by name to the
/// model's Float8Linear layers; checkpoints of before 2026-11-28 have none.
std::vector<SavedFloat8Scaling> saved_float8_scalings(const CheckpointedModel& model,
                                                      torch::serialize::InputArchive& manifest,
                                                      const std::string& directory) {
  std::vector<SavedFloat8Scaling> scalings;
  torch::serialize::InputArchive layers;
  if (!manifest.try_read(Float8LinearAccess::kScalingKey, layers)) return scalings;
  std::map<std::string, Float8LinearImpl*> layers_here;
  for (const auto& item : model.module.named_modules()) {
    if (auto* layer = dynamic_cast<Float8LinearImpl*>(item.value().get())) layers_here[item.key()] = layer;
  }
  const std::string manifest_path = path_in(directory, kManifest);
  for_each_entry(layers, manifest_path, "count", "l",
                 [&](std::int64_t, const std::string& name, torch::serialize::InputArchive& entry) {
                   auto it = layers_here.find(name);
                   if (it == layers_here.end()) {
                     throw UsageError(fmt::format(
                         "sharded checkpoint '{}' holds the FP8 scaling state of a Float8Linear '{}' that this model "
                         "does not have; it belongs to another model",
                         directory, name));
                   }
                   scalings.push_back(
                       {it->second, name, read<torch::serialize::InputArchive>(entry, manifest_path, "state")});
                 });
  return scalings;
}

/// Whether piece `piece` of `parameter`, held by `rank`, overlaps what
/// `destination` holds, and by how many elements.
std::int64_t piece_overlap(const SavedParameter& parameter, std::size_t piece, std::size_t rank,
                           const Destination& destination) {
  if (parameter.ranks[piece] != static_cast<std::int64_t>(rank)) return 0;
  const std::int64_t begin = std::max(parameter.begins[piece], destination.begin);
  const std::int64_t end =
      std::min(parameter.begins[piece] + parameter.lengths[piece], destination.begin + destination.value.numel());
  return std::max<std::int64_t>(end - begin, 0);
}

/// A checkpoint checked against the model, the optimizer and its files'
/// sizes by check_load(), before anything is written; write_load() writes it.
struct CheckedLoad {
  std::string directory;
  std::string id;
  std::vector<std::optional<SavedParameter>> saved;
  std::optional<OptimizerKind> kind;
  std::vector<std::string> tensors;
  std::vector<Destination> destinations;
  std::vector<std::size_t> files;  ///< The ranks whose files hold a part of this rank's destinations.
  std::map<std::string, at::Tensor> saved_replicated;
  std::vector<SavedFloat8Scaling> float8_scalings;
  torch::serialize::InputArchive extra;  ///< What the save's `extra` wrote, if the load asked for it.
};

CheckedLoad check_load(const CheckpointedModel& model, torch::optim::Optimizer* optimizer, const std::string& directory,
                       bool extra) {
  CheckedLoad checked;
  checked.directory = directory;
  const std::string manifest_path = path_in(directory, kManifest);
  torch::serialize::InputArchive manifest;
  if (!checkpoint::is_sharded_checkpoint(directory)) {
    throw UsageError(
        fmt::format("'{}' holds no sharded checkpoint ({} is missing): check the path, or the save did not finish; "
                    "every rank must see the directory (a shared filesystem)",
                    directory, kManifest));
  }
  checkpoint::load(manifest, manifest_path);
  if (read(manifest, manifest_path, "format").toInt() != kFormat) {
    throw UsageError(fmt::format("sharded checkpoint '{}' has format {}; this libddp reads format {}", directory,
                                 read(manifest, manifest_path, "format").toInt(), kFormat));
  }
  const std::string& id = checked.id = read(manifest, manifest_path, "id").toStringRef();
  const std::vector<std::int64_t> file_bytes = read(manifest, manifest_path, "file_bytes").toIntVector();

  // The saved parameters, matched to this model's by name.
  std::map<std::string, std::size_t> index_of;
  for (std::size_t i = 0; i < model.names.size(); ++i) index_of[model.names[i]] = i;
  std::vector<std::optional<SavedParameter>>& saved = checked.saved;
  saved.resize(model.trained.size());
  for_each_entry(
      manifest, manifest_path, "parameters", "p",
      [&](std::int64_t k, const std::string& name, torch::serialize::InputArchive& entry) {
        auto it = index_of.find(name);
        if (it == index_of.end()) {
          throw UsageError(
              fmt::format("sharded checkpoint '{}' holds a parameter '{}' that this model does not train; it belongs "
                          "to another model",
                          directory, name));
        }
        const at::Tensor& parameter = model.trained[it->second];
        const std::vector<std::int64_t> sizes = read(entry, manifest_path, "sizes").toIntVector();
        if (c10::IntArrayRef(sizes) != parameter.sizes()) {
          throw UsageError(fmt::format(
              "sharded checkpoint '{}' holds '{}' of shape [{}], the model's is [{}]; it belongs to another model",
              directory, name, fmt::join(sizes, ", "), fmt::join(parameter.sizes(), ", ")));
        }
        require_same_dtype(directory, name, read(entry, manifest_path, "dtype").toStringRef(),
                           c10::toString(trained_dtype(model, it->second)));
        const std::vector<std::int64_t> strides = read(entry, manifest_path, "strides").toIntVector();
        if (!same_strides_where_addressed(parameter.sizes(), strides, flat_layout_strides(parameter))) {
          throw UsageError(fmt::format(
              "sharded checkpoint '{}' holds '{}' with strides [{}], the model's are [{}]; give the model the "
              "saved memory format (channels_last or not) before loading",
              directory, name, fmt::join(strides, ", "), fmt::join(parameter.strides(), ", ")));
        }
        saved[it->second] = SavedParameter{k, read(entry, manifest_path, "step").toInt(),
                                           read(entry, manifest_path, "piece_ranks").toIntVector(),
                                           read(entry, manifest_path, "piece_begins").toIntVector(),
                                           read(entry, manifest_path, "piece_lengths").toIntVector()};
      });
  for (std::size_t i = 0; i < saved.size(); ++i) {
    if (!saved[i]) {
      throw UsageError(
          fmt::format("sharded checkpoint '{}' has no parameter '{}' of this model; it belongs to another model",
                      directory, model.names[i]));
    }
  }

  // The optimizer's state, if asked for: of the same optimizer, with the same tensors.
  std::optional<OptimizerKind>& kind = checked.kind;
  std::vector<std::string>& tensors = checked.tensors;
  if (optimizer != nullptr) {
    kind = kind_of(*optimizer);
    tensors = state_tensor_names(*kind, *optimizer);
    const std::string saved_kind = read(manifest, manifest_path, "optimizer").toStringRef();
    if (saved_kind.empty()) {
      throw UsageError(fmt::format(
          "sharded checkpoint '{}' holds no optimizer state (it was saved without an optimizer); load it without one",
          directory));
    }
    if (saved_kind != name_of(*kind)) {
      throw UsageError(fmt::format("sharded checkpoint '{}' holds the state of the optimizer {}; this one is {}",
                                   directory, saved_kind, name_of(*kind)));
    }
    const std::string saved_tensors = read(manifest, manifest_path, "optimizer_tensors").toStringRef();
    if (saved_tensors != fmt::format("{}", fmt::join(tensors, ","))) {
      throw UsageError(
          fmt::format("sharded checkpoint '{}' holds the optimizer tensors [{}], this optimizer keeps [{}]: it was "
                      "written with other optimizer options (amsgrad, momentum)",
                      directory, saved_tensors, fmt::join(tensors, ",")));
    }
  }

  // What this rank holds: its fragments, or every parameter whole.
  std::vector<Destination>& destinations = checked.destinations;
  for (std::size_t i = 0; i < model.trained.size(); ++i) {
    const at::Tensor& parameter = model.trained[i];
    const std::vector<std::int64_t> strides = flat_layout_strides(parameter);
    Destination destination;
    destination.parameter = i;
    if (model.sharded != nullptr) {
      destination.value = model.sharded->fragment_of(i);
      if (!destination.value.defined()) continue;
      destination.begin = model.sharded->fragment_begin(i);
    } else {
      destination.value = flat_in_layout(parameter, strides);
      if (!destination.value.is_alias_of(parameter)) destination.laid_out = destination.value;
    }
    if (kind && saved[i]->step >= 0) {
      for (const std::string& tensor : tensors) {
        at::Tensor state = model.sharded != nullptr
                               ? at::empty_like(destination.value)
                               : at::empty_strided(parameter.sizes(), strides, parameter.options());
        destination.flat_state[tensor] = alias(state, 0, {state.numel()}, {1});
        destination.state[tensor] = state;
      }
    }
    destinations.push_back(std::move(destination));
  }

  // What the manifest says covers them, and the files that hold it.
  std::vector<std::int64_t> covered(destinations.size(), 0);
  for (std::size_t rank = 0; rank < file_bytes.size(); ++rank) {
    bool needed = false;
    for (std::size_t d = 0; d < destinations.size(); ++d) {
      const SavedParameter& parameter = *saved[destinations[d].parameter];
      for (std::size_t piece = 0; piece < parameter.ranks.size(); ++piece) {
        const std::int64_t overlap = piece_overlap(parameter, piece, rank, destinations[d]);
        covered[d] += overlap;
        needed |= overlap > 0;
      }
    }
    if (!needed) continue;
    const std::string path = path_in(directory, rank_file(id, static_cast<int>(rank)));
    std::error_code error;
    const auto bytes = std::filesystem::file_size(path, error);
    if (error) {
      throw UsageError(
          fmt::format("sharded checkpoint '{}' lacks rank {}'s file '{}' ({}); every rank must see the directory (a "
                      "shared filesystem)",
                      directory, rank, path, error.message()));
    }
    if (static_cast<std::int64_t>(bytes) != file_bytes[rank]) {
      throw UsageError(fmt::format(
          "sharded checkpoint file '{}' has {} bytes, its manifest says {}: it is truncated or was overwritten", path,
          bytes, file_bytes[rank]));
    }
    checked.files.push_back(rank);
  }
  for (std::size_t d = 0; d < destinations.size(); ++d) {
    if (covered[d] != destinations[d].value.numel()) {
      throw UsageError(fmt::format(
          "sharded checkpoint '{}' covers {} of the {} elements of '{}' this rank holds: its manifest is corrupt",
          directory, covered[d], destinations[d].value.numel(), model.names[destinations[d].parameter]));
    }
  }

  // Buffers and frozen parameters, whole.
  auto replicated = read<torch::serialize::InputArchive>(manifest, manifest_path, "replicated");
  std::map<std::string, at::Tensor>& saved_replicated = checked.saved_replicated;
  const std::int64_t replicated_count = read(replicated, manifest_path, "count").toInt();
  for (std::int64_t k = 0; k < replicated_count; ++k) {
    auto entry = read<torch::serialize::InputArchive>(replicated, manifest_path, fmt::format("r{}", k));
    saved_replicated[read(entry, manifest_path, "name").toStringRef()] =
        read<at::Tensor>(entry, manifest_path, "value");
  }
  const std::vector<std::pair<std::string, at::Tensor>> replicated_here = replicated_tensors(model);
  for (const auto& [name, tensor] : replicated_here) {
    auto it = saved_replicated.find(name);
    if (it == saved_replicated.end() || it->second.sizes() != tensor.sizes()) {
      throw UsageError(fmt::format(
          "sharded checkpoint '{}' has no buffer or frozen parameter '{}' of shape [{}]; it belongs to another model",
          directory, name, fmt::join(tensor.sizes(), ", ")));
    }
    require_same_dtype(directory, name, c10::toString(it->second.scalar_type()), c10::toString(tensor.scalar_type()));
  }
  std::unordered_set<std::string> names_here;
  for (const auto& entry : replicated_here) names_here.insert(entry.first);
  for (const auto& entry : saved_replicated) {
    if (names_here.count(entry.first) == 0) {
      throw UsageError(fmt::format(
          "sharded checkpoint '{}' holds a buffer or frozen parameter '{}' that this model does not have; it belongs "
          "to another model",
          directory, entry.first));
    }
  }
  checked.float8_scalings = saved_float8_scalings(model, manifest, directory);
  for (SavedFloat8Scaling& scaling : checked.float8_scalings) {
    Float8LinearAccess::check_scaling(*scaling.layer, scaling.name, scaling.state);
  }
  if (extra && !manifest.try_read("extra", checked.extra)) {
    throw UsageError(fmt::format("sharded checkpoint '{}' holds no extra state: it was saved without it", directory));
  }
  return checked;
}

/// Reads the files check_load() found and writes the model, the optimizer's
/// state and `extra`. What can still fail here is the files' content (a
/// checksum, an element count): the files changed, or were corrupt.
void write_load(const CheckpointedModel& model, torch::optim::Optimizer* optimizer, CheckedLoad& checked,
                const std::function<void(torch::serialize::InputArchive&)>& extra) {
  // A forward that threw may have left gathers, and the casts feeding them, reading the shards.
  if (model.sharded != nullptr) model.sharded->settle_all();
  const std::vector<std::optional<SavedParameter>>& saved = checked.saved;
  for (std::size_t rank : checked.files) {
    const std::string path = path_in(checked.directory, rank_file(checked.id, static_cast<int>(rank)));
    torch::serialize::InputArchive archive;
    checkpoint::load(archive, path);
    if (read(archive, path, "id").toStringRef() != checked.id) {
      throw UsageError(fmt::format("sharded checkpoint file '{}' belongs to another save than its manifest", path));
    }
    for (Destination& destination : checked.destinations) {
      const SavedParameter& parameter = *saved[destination.parameter];
      for (std::size_t piece = 0; piece < parameter.ranks.size(); ++piece) {
        if (piece_overlap(parameter, piece, rank, destination) == 0) continue;
        auto entry = read<torch::serialize::InputArchive>(archive, path, fmt::format("p{}", parameter.entry));
        const auto value = read<at::Tensor>(entry, path, "value");
        if (value.numel() != parameter.lengths[piece]) {
          throw UsageError(fmt::format(
              "sharded checkpoint file '{}' holds {} elements of '{}' where its manifest says {}: it is corrupt", path,
              value.numel(), model.names[destination.parameter], parameter.lengths[piece]));
        }
        copy_overlap(destination.value, destination.begin, value, parameter.begins[piece]);
        for (auto& [tensor, flat] : destination.flat_state) {
          at::Tensor state;
          if (!entry.try_read(tensor, state)) {
            throw UsageError(fmt::format("sharded checkpoint file '{}' has no '{}' of '{}': it is corrupt", path,
                                         tensor, model.names[destination.parameter]));
          }
          copy_overlap(flat, destination.begin, state, parameter.begins[piece]);
        }
      }
    }
  }

  for (Destination& destination : checked.destinations) {
    const at::Tensor& parameter = model.trained[destination.parameter];
    if (destination.laid_out.defined()) {
      parameter.detach().copy_(destination.laid_out.as_strided(parameter.sizes(), flat_layout_strides(parameter)));
    }
    if (!checked.kind) continue;
    const at::Tensor target = stepped_part(model.trained, model.sharded, destination.parameter);
    if (destination.state.empty()) {
      erase_param_state(*optimizer, target);
    } else {
      write_param_state(*checked.kind, *optimizer, target,
                        ParamState{saved[destination.parameter]->step, destination.state});
    }
  }
  for (const auto& [name, tensor] : replicated_tensors(model)) {
    tensor.detach().copy_(checked.saved_replicated.at(name));
  }
  for (SavedFloat8Scaling& scaling : checked.float8_scalings) {
    Float8LinearAccess::load_scaling(*scaling.layer, scaling.name, scaling.state);
  }
  if (model.sharded != nullptr) model.sharded->shards_written();
  if (extra) extra(checked.extra);
}

}  // namespace

void save_sharded_checkpoint(const CheckpointedModel& model, ProcessGroup& process_group,
                             const torch::optim::Optimizer* optimizer, const std::string& directory,
                             const std::function<void(torch::serialize::OutputArchive&)>& extra) {
  c10::NoGradGuard no_grad;
  Communicator& comm = process_group.communicator();
  const int rank = comm.rank();
  const int world_size = comm.world_size();
  std::optional<OptimizerKind> kind;
  std::vector<std::string> tensors;
  if (optimizer != nullptr) {
    // Replays of a recorded step count AdamW's steps on the device.
    if (const auto* capturable = dynamic_cast<const optim::CapturableOptimizer*>(optimizer)) {
      capturable->sync_host_state();
    }
    kind = kind_of(*optimizer);
    tensors = state_tensor_names(*kind, *optimizer);
  }
  auto stepped = [&](std::size_t i) { return stepped_part(model.trained, model.sharded, i); };

  // One id names this save's files, so that no manifest reads another save's.
  const auto long_options = at::TensorOptions().dtype(at::kLong).device(comm.device());
  at::Tensor id_value = at::zeros({1}, long_options);
  if (rank == 0) {
    std::random_device random;
    id_value.fill_(static_cast<std::int64_t>(((std::uint64_t{random()} << 32) | random()) >> 1));
  }
  comm.broadcast(id_value, 0)->wait();
  const std::string id = fmt::format("{:016x}", static_cast<std::uint64_t>(id_value.item<std::int64_t>()));

  const std::vector<Piece> mine = pieces_of(model, rank, world_size);
  const std::vector<std::int64_t> step = kind ? agreed_steps(*kind, *optimizer, model.trained, model.sharded, comm)
                                              : std::vector<std::int64_t>(model.trained.size(), -1);

  const std::string my_file = path_in(directory, rank_file(id, rank));
  std::int64_t bytes = 0;
  std::exception_ptr failure;
  try {
    torch::serialize::OutputArchive archive;
    archive.write("id", c10::IValue(id));
    archive.write("rank", c10::IValue(static_cast<std::int64_t>(rank)));
    for (const Piece& piece : mine) {
      const at::Tensor& parameter = model.trained[piece.parameter];
      const std::vector<std::int64_t> strides = flat_layout_strides(parameter);
      auto part = [&](const at::Tensor& whole) {
        return model.sharded ? whole : flat_in_layout(whole, strides).narrow(0, piece.begin, piece.length);
      };
      torch::serialize::OutputArchive entry;
      entry.write("value", host_copy(part(stepped(piece.parameter))));
      if (kind) {
        const ParamState state = read_param_state(*kind, *optimizer, stepped(piece.parameter));
        for (const std::string& tensor : tensors) {
          auto it = state.tensors.find(tensor);
          if (it != state.tensors.end() && it->second.defined()) entry.write(tensor, host_copy(part(it->second)));
        }
      }
      archive.write(fmt::format("p{}", piece.parameter), entry);
    }
    checkpoint::save(archive, my_file);
    bytes = static_cast<std::int64_t>(std::filesystem::file_size(my_file));
  } catch (...) {
    failure = std::current_exception();
  }
  try {
    const std::vector<std::int64_t> file_bytes =
        agree(comm, bytes, failure, fmt::format("writing sharded checkpoint '{}'", directory));

    // The manifest commits the checkpoint.
    checkpoint::save_on_rank0(
        process_group, path_in(directory, kManifest), [&](torch::serialize::OutputArchive& archive) {
          archive.write("format", c10::IValue(kFormat));
          archive.write("id", c10::IValue(id));
          archive.write("world_size", c10::IValue(static_cast<std::int64_t>(world_size)));
          archive.write("sharding", c10::IValue(model.sharding));
          archive.write("file_bytes", c10::IValue(file_bytes));
          archive.write("optimizer", c10::IValue(std::string(kind ? name_of(*kind) : "")));
          archive.write("optimizer_tensors", c10::IValue(fmt::format("{}", fmt::join(tensors, ","))));
          std::vector<SavedParameter> saved(model.trained.size());
          for (int holder = 0; holder < world_size; ++holder) {
            for (const Piece& piece : pieces_of(model, holder, world_size)) {
              SavedParameter& parameter = saved[piece.parameter];
              parameter.ranks.push_back(holder);
              parameter.begins.push_back(piece.begin);
              parameter.lengths.push_back(piece.length);
            }
          }
          for (std::size_t i = 0; i < model.trained.size(); ++i) {
            const at::Tensor& parameter = model.trained[i];
            torch::serialize::OutputArchive entry;
            entry.write("name", c10::IValue(model.names[i]));
            entry.write("sizes", c10::IValue(parameter.sizes().vec()));
            entry.write("strides", c10::IValue(flat_layout_strides(parameter)));
            entry.write("dtype", c10::IValue(std::string(c10::toString(trained_dtype(model, i)))));
            entry.write("step", c10::IValue(step[i]));
            entry.write("piece_ranks", c10::IValue(saved[i].ranks));
            entry.write("piece_begins", c10::IValue(saved[i].begins));
            entry.write("piece_lengths", c10::IValue(saved[i].lengths));
            archive.write(fmt::format("p{}", i), entry);
          }
          archive.write("parameters", c10::IValue(static_cast<std::int64_t>(model.trained.size())));
          torch::serialize::OutputArchive replicated;
          std::int64_t count = 0;
          for (const auto& [name, tensor] : replicated_tensors(model)) {
            torch::serialize::OutputArchive entry;
            entry.write("name", c10::IValue(name));
            entry.write("value", host_copy(tensor));
            replicated.write(fmt::format("r{}", count++), entry);
          }
          replicated.write("count", c10::IValue(count));
          archive.write("replicated", replicated);
          torch::serialize::OutputArchive float8_layers = float8_scalings(model);
          archive.write(Float8LinearAccess::kScalingKey, float8_layers);
          if (extra) {
            torch::serialize::OutputArchive extra_archive;
            extra(extra_archive);
            archive.write("extra", extra_archive);
          }
        });
  } catch (...) {
    // A save that failed before its manifest was committed leaves orphans:
    // each failed attempt would add a whole checkpoint of them (and a full
    // disk stay full). One that failed after it (flushing the directory, or
    // the ranks' closing agreement) has replaced the previous manifest: its
    // files are now the checkpoint, and the previous one's are kept too. In
    // doubt the files stay: orphans cost less than a checkpoint without them.
    if (surely_uncommitted(directory, id)) {
      std::error_code ignored;
      std::filesystem::remove(my_file, ignored);
    }
    throw;
  }
  if (rank == 0) remove_stale_files(directory, id);
}

void load_sharded_checkpoint(const CheckpointedModel& model, ProcessGroup& process_group,
                             torch::optim::Optimizer* optimizer, const std::string& directory,
                             const std::function<void(torch::serialize::InputArchive&)>& extra) {
  c10::NoGradGuard no_grad;
  const std::string what = fmt::format("loading sharded checkpoint '{}'", directory);
  // No rank writes anything unless every rank's checks passed: a rank that
  // went ahead would hold other parameters than the one that refused.
  std::optional<CheckedLoad> checked;
  std::exception_ptr failure;
  try {
    checked = check_load(model, optimizer, directory, extra != nullptr);
  } catch (...) {
    failure = std::current_exception();
  }
  agree(process_group.communicator(), 0, failure, what);
  try {
    write_load(model, optimizer, *checked, extra);
  } catch (...) {
    failure = std::current_exception();
  }
  agree(process_group.communicator(), 0, failure, what);
}

}  // namespace ddp::detail

namespace ddp::checkpoint {

bool is_sharded_checkpoint(const std::string& directory) {
  return std::filesystem::is_regular_file(detail::path_in(directory, detail::kManifest));
}

}  // namespace ddp::checkpoint
