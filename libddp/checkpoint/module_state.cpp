#include "checkpoint/module_state.h"

#include <unordered_map>

#include <torch/nn/module.h>
#include <torch/serialize/output-archive.h>

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
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::OutputArchive child_archive(archive.compilation_unit());
    write(*child.value(), host, child_archive);
    archive.write(child.key(), child_archive);
  }
}

}  // namespace

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
