#include <ddp/float8.h>

#include <unordered_set>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/modules/linear.h>

#include "float8/linear_state.h"
#include "float8/support.h"

namespace ddp::float8 {

namespace {

/// The model itself, then its descendants with their paths. The model is
/// passed by reference and may not live in a shared_ptr, so it is not asked
/// for itself.
std::vector<std::pair<std::string, torch::nn::Module*>> modules_with_paths(torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::nn::Module*>> modules{{"(root)", &model}};
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    modules.emplace_back(item.key(), item.value().get());
  }
  return modules;
}

}  // namespace

Report enable_float8(torch::nn::Module& model, const Float8Options& options, const Filter& filter) {
  Report report;
  for (const auto& [path, module] : modules_with_paths(model)) {
    if (auto* layer = dynamic_cast<Float8LinearImpl*>(module)) {
      if (filter && !filter(path, *layer)) {
        report.skipped.emplace_back(path, "excluded by the filter");
        continue;
      }
      const auto& shape = layer->options;
      if (shape.in_features() % 16 != 0 || shape.out_features() % 16 != 0) {
        report.skipped.emplace_back(
            path, fmt::format("features {} -> {} are not multiples of 16", shape.in_features(), shape.out_features()));
        continue;
      }
      // A GPU layer is checked now; one still on the CPU when it first runs.
      if (layer->weight.is_cuda()) detail::check_float8_supported(layer->weight.device());
      layer->set_float8_enabled(false);  // drops scaling state of an earlier recipe
      layer->float8_options = Float8Options(options).enabled(false);
      layer->set_float8_enabled(true);
      report.converted.push_back(path);
    } else if (dynamic_cast<torch::nn::LinearImpl*>(module) != nullptr) {
      report.skipped.emplace_back(path,
                                  "a torch::nn::Linear; declare it as ddp::Float8Linear (same parameters and "
                                  "state_dict keys) to let it run in FP8");
    }
  }
  return report;
}

void all_reduce_amaxes(torch::nn::Module& model, ProcessGroup& process_group) {
  std::vector<detail::TensorScaling*> scalings;
  // A layer registered under two paths is visited twice; its histories must
  // be updated once.
  std::unordered_set<detail::Float8LinearState*> seen;
  for (const auto& [path, module] : modules_with_paths(model)) {
    auto* layer = dynamic_cast<Float8LinearImpl*>(module);
    detail::Float8LinearState* state = layer != nullptr ? detail::Float8LinearAccess::state(*layer) : nullptr;
    if (state == nullptr || !state->input.delayed() || !seen.insert(state).second) continue;
    const auto layer_scalings = state->scalings();
    scalings.insert(scalings.end(), layer_scalings.begin(), layer_scalings.end());
  }
  if (scalings.empty()) return;
  if (process_group.world_size() == 1) {
    detail::TensorScaling::commit_pending_amaxes(scalings);
    return;
  }
  // Every rank enters the largest amax of any rank, pending here or not, so
  // that the histories, and the scales, stay the same on every rank.
  std::vector<at::Tensor> pending;
  pending.reserve(scalings.size());
  for (detail::TensorScaling* scaling : scalings) {
    scaling->withdraw_weight_cast();  // its amax is no cast's yet: the forward that takes it has not run
    pending.push_back(scaling->pending_amax());
  }
  Communicator& communicator = process_group.communicator();
  at::Tensor amaxes = at::stack(pending).to(communicator.device());
  communicator.all_reduce(amaxes, ReduceOp::kMax)->wait_stream();
  detail::TensorScaling::commit_pending_amaxes(scalings, amaxes);
}

}  // namespace ddp::float8
