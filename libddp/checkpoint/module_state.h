#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::nn {
class Module;
}  // namespace torch::nn
namespace torch::serialize {
class OutputArchive;
}  // namespace torch::serialize

namespace ddp::detail {

class ShardedParameters;

/// Writes `module` into `archive` on rank `rank` 0 as Module::save does (the
/// same nested archives, which Module::load reads), with each of the trained
/// `parameters` taken from `sharded`: gathered one bucket at a time and
/// copied to host memory, so no device holds the whole model, even where
/// the module's own tensors hold no memory (kFull's units). Collective.
void save_module_state(const torch::nn::Module& module, const std::vector<at::Tensor>& parameters,
                       ShardedParameters& sharded, int rank, torch::serialize::OutputArchive& archive);

}  // namespace ddp::detail
