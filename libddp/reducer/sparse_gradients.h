#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <ddp/communicator.h>

namespace torch::nn {
class Module;
}

namespace ddp::detail {

/// The parameters whose gradients are sparse (embeddings built with
/// sparse(true)), which stay out of the reducer's dense buckets, as in
/// PyTorch's DDP. After each reduced backward every rank gathers every
/// rank's rows (indices and values), so that each holds the average:
/// the same rows summed and divided by the world size. A parameter this
/// rank did not use contributes no rows, so ranks never disagree on what
/// they gather.
class SparseGradients {
 public:
  SparseGradients(std::vector<at::Tensor> parameters, std::vector<std::string> names, Communicator& comm);

  /// The trained parameters of `module` whose gradients will be sparse:
  /// the weights of Embedding and EmbeddingBag modules with sparse(true).
  static std::vector<at::Tensor> find(torch::nn::Module& module);

  /// Replaces each parameter's gradient by the ranks' sum divided by
  /// `averaging_ranks` (every rank, or those a ddp::Join counts).
  void average(int averaging_ranks);

  bool empty() const { return parameters_.empty(); }

 private:
  std::vector<at::Tensor> parameters_;
  std::vector<std::string> names_;
  Communicator& comm_;
};

}  // namespace ddp::detail
