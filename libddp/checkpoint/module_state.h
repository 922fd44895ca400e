#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::nn {
class Module;
}  // namespace torch::nn
namespace torch::serialize {
class InputArchive;
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

/// Reads what Module::save (or save_module_state) wrote into `module`, in
/// place: every tensor keeps its device, storage and autograd identity.
/// (Module::load moves a tensor to the archive's device with set_data,
/// which drops the parameter's gradient accumulator and with it the hooks
/// DDP installed there.) Each of the trained `parameters` goes, with
/// `sharded`, into this rank's fragment of it (the next forward gathers);
/// `sharded` null: into the parameter. UsageError naming a tensor the
/// archive lacks or holds in another shape or dtype, before anything is
/// written: a refused load leaves the model as it was.
void load_module_state(torch::nn::Module& module, const std::vector<at::Tensor>& parameters, ShardedParameters* sharded,
                       torch::serialize::InputArchive& archive);

}  // namespace ddp::detail
