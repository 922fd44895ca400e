// libddp against PyTorch's own DistributedDataParallel: the same model,
// initial weights, data, optimizer and steps, over Gloo on 2 processes, must
// reach the same parameters. Runs where python3 has torch (CI does).

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "support/multiprocess.h"

#ifndef DDP_PYTORCH_REFERENCE_SCRIPT
#error "DDP_PYTORCH_REFERENCE_SCRIPT must name tests/python/torch_ddp_reference.py"
#endif

namespace {

using namespace ddp::testing;
namespace fs = std::filesystem;

// The same closed forms as the Python script.
torch::Tensor formula(at::IntArrayRef shape, double offset, double scale) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return (torch::sin(torch::arange(n, torch::kDouble) * 0.37 + offset) * scale).to(torch::kFloat).reshape(shape);
}

torch::nn::Sequential make_model() {
  torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::Functional(torch::tanh), torch::nn::Linear(32, 4));
  torch::NoGradGuard no_grad;
  int k = 0;
  for (auto& p : model->parameters()) p.copy_(formula(p.sizes(), k++, 0.3));
  return model;
}

torch::Tensor flat_parameters(torch::nn::Sequential& model) {
  std::vector<torch::Tensor> flat;
  for (auto& p : model->parameters()) flat.push_back(p.detach().reshape(-1));
  return torch::cat(flat);
}

TEST(DdpVsPyTorch, SameParametersAsTorchDistributedDataParallel) {
  const fs::path reference = fs::temp_directory_path() / ("ddp_vs_pytorch_" + std::to_string(::getpid()) + ".bin");
  if (std::getenv("DDP_TEST_CHILD_RANK") == nullptr) {
    if (std::system("python3 -c 'import torch' > /dev/null 2>&1") != 0) {
      GTEST_SKIP() << "python3 has no torch: nothing to compare against";
    }
    const std::string command = std::string("python3 ") + DDP_PYTORCH_REFERENCE_SCRIPT + " " + reference.string();
    ASSERT_EQ(std::system(command.c_str()), 0) << "the PyTorch reference run failed: " << command;
  }
  RunOptions options;
  options.env["DDP_REFERENCE_FILE"] = reference.string();
  expect_all_succeeded(run_ranks(2, [](int rank) {
    auto pg = ddp::init(ddp::InitOptions().backend(ddp::Backend::kGloo));
    ddp::DistributedDataParallel<torch::nn::Sequential> model(make_model(), pg);
    torch::optim::SGD optimizer(model.module()->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int step = 0; step < 3; ++step) {
      optimizer.zero_grad();
      torch::Tensor x = formula({4, 16}, 1.3 * step + 0.7 * rank, 1.0);
      torch::Tensor y = formula({4, 4}, 2.1 * step + 0.5 * rank, 1.0);
      torch::mse_loss(model(x), y).backward();
      optimizer.step();
    }
    const torch::Tensor mine = flat_parameters(model.module());
    std::ifstream in(std::getenv("DDP_REFERENCE_FILE"), std::ios::binary);
    std::vector<float> theirs(static_cast<std::size_t>(mine.numel()));
    in.read(reinterpret_cast<char*>(theirs.data()), static_cast<std::streamsize>(theirs.size() * sizeof(float)));
    require(in.gcount() == static_cast<std::streamsize>(theirs.size() * sizeof(float)),
            "the reference file holds fewer parameters than the model");
    const double diff = (mine - torch::from_blob(theirs.data(), {mine.numel()}).clone()).abs().max().item<double>();
    require(diff <= 1e-5, "libddp and PyTorch DDP differ by " + std::to_string(diff));
    // Training moved the weights: a comparison of untrained models would prove nothing.
    auto initial = make_model();
    require((mine - flat_parameters(initial)).abs().max().item<double>() > 1e-3,
            "the parameters did not change during training");
  }, options));
  fs::remove(reference);
}

}  // namespace
