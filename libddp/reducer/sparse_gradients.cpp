#include "reducer/sparse_gradients.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>

#include <ddp/errors.h>

namespace ddp::detail {
namespace {

/// Every rank's `tensor` (equal shapes), stacked along a new first dimension.
at::Tensor gather_from_all(Communicator& comm, const at::Tensor& tensor) {
  std::vector<int64_t> sizes{comm.world_size()};
  sizes.insert(sizes.end(), tensor.sizes().begin(), tensor.sizes().end());
  at::Tensor gathered = at::empty({comm.world_size() * tensor.numel()}, tensor.options());
  comm.all_gather(gathered, tensor.contiguous().reshape({-1}))->wait();
  return gathered.view(sizes);
}

}  // namespace

SparseGradients::SparseGradients(std::vector<at::Tensor> parameters, std::vector<std::string> names, Communicator& comm)
    : parameters_(std::move(parameters)), names_(std::move(names)), comm_(comm) {}

std::vector<at::Tensor> SparseGradients::find(torch::nn::Module& module) {
  std::vector<at::Tensor> sparse;
  for (const auto& child : module.modules(/*include_self=*/true)) {
    if (const auto* embedding = dynamic_cast<const torch::nn::EmbeddingImpl*>(child.get())) {
      if (embedding->options.sparse() && embedding->weight.requires_grad()) sparse.push_back(embedding->weight);
    } else if (const auto* bag = dynamic_cast<const torch::nn::EmbeddingBagImpl*>(child.get())) {
      if (bag->options.sparse() && bag->weight.requires_grad()) sparse.push_back(bag->weight);
    }
  }
  return sparse;
}

void SparseGradients::average(int averaging_ranks) {
  const c10::Device device = comm_.device();
  const int world = comm_.world_size();
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    at::Tensor& parameter = parameters_[i];
    at::Tensor grad = parameter.grad();
    if (grad.defined() && !grad.is_sparse()) {
      throw UsageError(
          fmt::format("libddp: '{}' was declared sparse (an embedding with sparse(true)) but received "
                      "a dense gradient; build the module with sparse(false), or keep its gradient sparse",
                      names_[i]));
    }
    // The rows this rank touched (none if it did not use the parameter).
    const int64_t row_size = parameter.numel() / std::max<int64_t>(parameter.size(0), 1);
    at::Tensor indices = at::empty({0}, at::TensorOptions().dtype(at::kLong).device(device));
    at::Tensor values = at::empty({0, row_size}, parameter.options().device(device));
    if (grad.defined()) {
      grad = grad.coalesce();
      indices = grad.indices().reshape({-1}).to(device);
      values = grad.values().reshape({indices.numel(), row_size}).to(device);
    }
    // Counts first, so that every rank pads to the longest and the gathers have one size.
    const at::Tensor counts =
        gather_from_all(comm_, at::full({1}, indices.numel(), at::TensorOptions().dtype(at::kLong).device(device)))
            .reshape({-1})
            .cpu();
    const auto* count = counts.data_ptr<int64_t>();
    const int64_t longest = *std::max_element(count, count + world);
    if (longest == 0) continue;  // no rank used it: its gradient stays as it was
    const int64_t mine = indices.numel();
    const at::Tensor all_indices =
        gather_from_all(comm_, at::constant_pad_nd(indices, {0, longest - mine}, 0)).reshape({world, longest});
    const at::Tensor all_values = gather_from_all(comm_, at::constant_pad_nd(values, {0, 0, 0, longest - mine}, 0));
    std::vector<at::Tensor> rank_indices, rank_values;
    for (int rank = 0; rank < world; ++rank) {
      rank_indices.push_back(all_indices[rank].narrow(0, 0, count[rank]));
      rank_values.push_back(all_values[rank].narrow(0, 0, count[rank]));
    }
    std::vector<int64_t> value_shape{-1};
    value_shape.insert(value_shape.end(), parameter.sizes().begin() + 1, parameter.sizes().end());
    at::Tensor summed = at::sparse_coo_tensor(at::cat(rank_indices).unsqueeze(0),
                                              at::cat(rank_values).reshape(value_shape), parameter.sizes())
                            .coalesce();
    parameter.mutable_grad() = (summed / averaging_ranks).to(parameter.device());
  }
}

}  // namespace ddp::detail
