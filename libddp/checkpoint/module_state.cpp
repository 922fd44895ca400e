#include "checkpoint/module_state.h"

#include <set>
#include <string>
#include <unordered_map>

#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <ddp/errors.h>
#include <ddp/float8.h>

#include "float8/linear_state.h"
#include "sharding/sharded_parameters.h"

namespace ddp::detail {
namespace {

using HostCopies = std::unordered_map<const c10::TensorImpl*, at::Tensor>;

// Module::save's layout: the module's own parameters and buffers by name,
// then one archive per serializable child.
void write(const torch::nn::Module& module, const HostCopies& host, torch::serialize::OutputArchive& archive) {
  for (const auto& parameter : module.named_parameters(/*recurse=*/false)) {
    auto it = host.find(parameter.value().unsafeGetTensorImpl());
    archive.write(parameter.key(), it != host.end() ? it->second : parameter.value());
  }
  for (const auto& buffer : module.named_buffers(/*recurse=*/false)) {
    archive.write(buffer.key(), buffer.value(), /*is_buffer=*/true);
  }
  // Where Float8LinearImpl::save puts its delayed-scaling state.
  if (const auto* layer = dynamic_cast<const Float8LinearImpl*>(&module)) {
    torch::serialize::OutputArchive scaling(archive.compilation_unit());
    if (Float8LinearAccess::save_scaling(*layer, scaling)) archive.write(Float8LinearAccess::kScalingKey, scaling);
  }
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::OutputArchive child_archive(archive.compilation_unit());
    write(*child.value(), host, child_archive);
    archive.write(child.key(), child_archive);
  }
}

using TrainedIndex = std::unordered_map<const c10::TensorImpl*, std::size_t>;

// Module::load's walk: checks everything the archive holds against the model and, with `write`, copies it in place.
void read(torch::nn::Module& module, const std::string& path, const TrainedIndex& trained, ShardedParameters* sharded,
          torch::serialize::InputArchive& archive, bool write) {
  const auto take = [&](const std::string& key, at::Tensor& target, bool is_buffer) {
    const std::string name = path.empty() ? key : path + "." + key;
    at::Tensor loaded;
    if (!archive.try_read(key, loaded, is_buffer)) {
      throw UsageError(
          fmt::format("libddp: the checkpoint has no '{}' of this model; it belongs to another model", name));
    }
    if (loaded.sizes() != target.sizes()) {
      throw UsageError(fmt::format(
          "libddp: the checkpoint holds '{}' of shape [{}], the model's is [{}]; it belongs to another model", name,
          fmt::join(loaded.sizes(), ", "), fmt::join(target.sizes(), ", ")));
    }
    auto it = trained.find(target.unsafeGetTensorImpl());
    // A trained parameter's dtype is its fp32 master's where the units hold bf16.
    const at::ScalarType dtype =
        sharded != nullptr && it != trained.end() ? sharded->trained_dtype(it->second) : target.scalar_type();
    if (loaded.scalar_type() != dtype) {
      throw UsageError(fmt::format(
          "libddp: the checkpoint holds '{}' in {}, the model's is {}; convert the model to {} before loading", name,
          c10::toString(loaded.scalar_type()), c10::toString(dtype), c10::toString(loaded.scalar_type())));
    }
    if (!write) return;
    if (sharded != nullptr && it != trained.end()) {
      const at::Tensor fragment = sharded->fragment_of(it->second);
      if (fragment.defined()) fragment.copy_(sharded->part_of(it->second, loaded));
    } else {
      target.detach().copy_(loaded);
    }
  };
  std::set<std::string> known;
  for (auto& parameter : module.named_parameters(/*recurse=*/false)) {
    take(parameter.key(), parameter.value(), false);
    known.insert(parameter.key());
  }
  for (auto& buffer : module.named_buffers(/*recurse=*/false)) {
    take(buffer.key(), buffer.value(), true);
    known.insert(buffer.key());
  }
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    known.insert(child.key());
  }
  auto* const float8_layer = dynamic_cast<Float8LinearImpl*>(&module);
  if (float8_layer != nullptr) known.insert(Float8LinearAccess::kScalingKey);
  // As PyTorch's strict load_state_dict: what the model lacks would otherwise
  // be dropped without a word, and a checkpoint of a larger model would load.
  for (const std::string& key : archive.keys()) {
    if (known.count(key) == 0) {
      throw UsageError(
          fmt::format("libddp: the checkpoint holds '{}', which this model does not have; it belongs to another model",
                      path.empty() ? key : path + "." + key));
    }
  }
  torch::serialize::InputArchive scaling;
  if (float8_layer != nullptr && archive.try_read(Float8LinearAccess::kScalingKey, scaling)) {
    if (write) {
      Float8LinearAccess::load_scaling(*float8_layer, path, scaling);
    } else {
      Float8LinearAccess::check_scaling(*float8_layer, path, scaling);
    }
  }
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    const std::string child_path = path.empty() ? child.key() : path + "." + child.key();
    torch::serialize::InputArchive child_archive;
    if (!archive.try_read(child.key(), child_archive)) {
      throw UsageError(fmt::format(
          "libddp: the checkpoint has no module '{}' of this model; it belongs to another model", child_path));
    }
    read(*child.value(), child_path, trained, sharded, child_archive, write);
  }
}

}  // namespace

void load_module_state(torch::nn::Module& module, const std::vector<at::Tensor>& parameters, ShardedParameters* sharded,
                       torch::serialize::InputArchive& archive) {
  c10::NoGradGuard no_grad;
  TrainedIndex trained;
  for (std::size_t i = 0; i < parameters.size(); ++i) trained[parameters[i].unsafeGetTensorImpl()] = i;
  // A forward that threw may have left gathers, and the casts feeding them, reading the shards.
  if (sharded != nullptr) sharded->settle_all();
  read(module, "", trained, sharded, archive, /*write=*/false);  // a refused load changes nothing
  read(module, "", trained, sharded, archive, /*write=*/true);
  if (sharded != nullptr) sharded->shards_written();
}

void save_module_state(const torch::nn::Module& module, const std::vector<at::Tensor>& parameters,
                       ShardedParameters& sharded, int rank, torch::serialize::OutputArchive& archive) {
  HostCopies host;
  sharded.gather_whole([&](std::size_t index) { return sharded.fragment_of(index); },
                       [&](std::size_t index, const at::Tensor& values) {
                         if (rank != 0) return;
                         host[parameters[index].unsafeGetTensorImpl()] =
                             values.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
                       });
  if (rank == 0) write(module, host, archive);
}

}  // namespace ddp::detail
