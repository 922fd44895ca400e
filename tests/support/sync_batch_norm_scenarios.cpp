#include "support/sync_batch_norm_scenarios.h"

#include <string>

#include <torch/torch.h>

#include "support/multiprocess.h"

namespace ddp::testing {
namespace {

constexpr std::int64_t kChannels = 3;

/// Rank `rank`'s input and loss weights at `step`: [n, C, 4, 4], from (step, rank).
std::pair<torch::Tensor, torch::Tensor> batch_of(int rank, int step, int n, const torch::Device& device) {
  auto generator = at::detail::createCPUGenerator(1000 * step + rank);
  torch::Tensor x = torch::randn({n, kChannels, 4, 4}, generator) * 2 + 3;  // a mean far from 0
  torch::Tensor weights = torch::randn({n, kChannels, 4, 4}, generator);
  return {x.to(device), weights.to(device)};
}

void require_close(const torch::Tensor& got, const torch::Tensor& expected, const std::string& what) {
  require(got.sizes() == expected.sizes() && torch::allclose(got.cpu(), expected.cpu(), 1e-4, 1e-5),
          what + " differs from one process's");
}

torch::Tensor summed_over_ranks(Communicator& comm, const torch::Tensor& tensor) {
  torch::Tensor sum = tensor.detach().clone();
  comm.all_reduce(sum)->wait();
  return sum;
}

void set_affine(torch::Tensor weight, torch::Tensor bias) {
  torch::NoGradGuard no_grad;
  weight.copy_(torch::tensor({0.5, 1.5, -1.0}));
  bias.copy_(torch::tensor({0.1, -0.2, 0.3}));
}

}  // namespace

void check_sync_batch_norm_matches_one_process(const std::shared_ptr<ProcessGroup>& pg,
                                               const std::vector<int>& batches) {
  const int rank = pg->rank();
  const torch::Device device = pg->device();
  auto& comm = pg->communicator();
  SyncBatchNorm sync(torch::nn::BatchNormOptions(kChannels), pg);
  torch::nn::BatchNorm2d reference(kChannels);
  set_affine(sync->weight, sync->bias);
  set_affine(reference->weight, reference->bias);
  sync->to(device);
  reference->to(device);
  for (int step = 0; step < 2; ++step) {
    const std::string at = "step " + std::to_string(step) + ", rank " + std::to_string(rank) + ": ";
    std::vector<torch::Tensor> xs, ws;
    for (int r = 0; r < static_cast<int>(batches.size()); ++r) {
      auto [x, w] = batch_of(r, step, batches[static_cast<std::size_t>(r)], device);
      xs.push_back(x);
      ws.push_back(w);
    }
    // This rank: its own batch; its loss weighs the output by its weights.
    torch::Tensor x = xs[static_cast<std::size_t>(rank)].clone().requires_grad_(true);
    sync->zero_grad();
    torch::Tensor y = sync(x);
    (y * ws[static_cast<std::size_t>(rank)]).sum().backward();
    // One process: every batch at once, the sum of every rank's loss.
    torch::Tensor all = torch::cat(xs).requires_grad_(true);
    reference->zero_grad();
    torch::Tensor expected = reference(all);
    (expected * torch::cat(ws)).sum().backward();
    std::int64_t first = 0;
    for (int r = 0; r < rank; ++r) first += batches[static_cast<std::size_t>(r)];
    const std::int64_t n = batches[static_cast<std::size_t>(rank)];
    require_close(y, expected.narrow(0, first, n), at + "the output");
    require_close(x.grad(), all.grad().narrow(0, first, n), at + "the input's gradient");
    require_close(summed_over_ranks(comm, sync->weight.grad()), reference->weight.grad(), at + "the weight's gradient");
    require_close(summed_over_ranks(comm, sync->bias.grad()), reference->bias.grad(), at + "the bias's gradient");
    require_close(sync->running_mean, reference->running_mean, at + "the running mean");
    require_close(sync->running_var, reference->running_var, at + "the running variance");
    require(sync->num_batches_tracked.item<std::int64_t>() == step + 1, at + "num_batches_tracked is off");
  }
  sync->eval();
  reference->eval();
  const torch::Tensor probe = batch_of(rank, 7, 2, device).first;
  require_close(sync(probe), reference(probe), "evaluation (running statistics)");
}

namespace {

struct ConvNetImpl : torch::nn::Module {
  explicit ConvNetImpl(torch::nn::AnyModule norm_layer)
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(kChannels, kChannels, 3).padding(1)))),
        norm(std::move(norm_layer)),
        head(register_module("head", torch::nn::Linear(kChannels, 2))) {
    register_module("norm", norm.ptr());
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::relu(norm.forward(conv(x)));
    return head(h.mean({2, 3}));
  }
  torch::nn::Conv2d conv;
  torch::nn::AnyModule norm;
  torch::nn::Linear head;
};
TORCH_MODULE(ConvNet);

}  // namespace

void check_sync_batch_norm_under_ddp_matches_one_process(const std::shared_ptr<ProcessGroup>& pg) {
  const torch::Device device = pg->device();
  const int world = pg->world_size();
  torch::manual_seed(0);
  ConvNet net{torch::nn::AnyModule(SyncBatchNorm(torch::nn::BatchNormOptions(kChannels), pg))};
  torch::manual_seed(0);
  ConvNet reference{torch::nn::AnyModule(torch::nn::BatchNorm2d(kChannels))};
  net->to(device);
  reference->to(device);
  DistributedDataParallel<ConvNet> model(net, pg);
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD reference_optimizer(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 3; ++step) {
    std::vector<torch::Tensor> xs, ts;
    for (int r = 0; r < world; ++r) {
      auto [x, w] = batch_of(r, step, 4, device);
      xs.push_back(x);
      ts.push_back(w.mean({1, 2, 3}).unsqueeze(1).repeat({1, 2}));
    }
    optimizer.zero_grad();
    torch::mse_loss(model(xs[static_cast<std::size_t>(pg->rank())]), ts[static_cast<std::size_t>(pg->rank())])
        .backward();
    optimizer.step();
    reference_optimizer.zero_grad();
    torch::mse_loss(reference->forward(torch::cat(xs)), torch::cat(ts)).backward();
    reference_optimizer.step();
  }
  const auto expected = reference->named_parameters();
  for (const auto& item : net->named_parameters()) require_close(item.value(), expected[item.key()], item.key());
  const auto expected_buffers = reference->named_buffers();
  for (const auto& item : net->named_buffers()) {
    if (item.key() == "norm.num_batches_tracked") continue;  // an integer count: equal by construction above
    require_close(item.value(), expected_buffers[item.key()], item.key());
  }
}

namespace {

constexpr std::int64_t kFusedChannels = 8;  // a multiple of the kernels' 4

/// Rank `rank`'s input, residual and output gradient: [n, 8, 4, 4] fp32,
/// rounded to `dtype`, so that the fp32 reference sees the values the rank does.
std::vector<torch::Tensor> fused_batch_of(int rank, int n, torch::ScalarType dtype) {
  auto generator = at::detail::createCPUGenerator(500 + rank);
  std::vector<torch::Tensor> tensors;
  for (double mean : {3.0, 0.0, 0.0}) {
    tensors.push_back((torch::randn({n, kFusedChannels, 4, 4}, generator) * 2 + mean).to(dtype).to(torch::kFloat));
  }
  return tensors;
}

void require_within(const torch::Tensor& got, const torch::Tensor& expected, double tolerance,
                    const std::string& what) {
  require(got.defined() && got.sizes() == expected.sizes(),
          what + ": missing, or its shape differs from one process's");
  if (expected.numel() == 0) return;
  const torch::Tensor a = got.detach().to(torch::kFloat).cpu(), b = expected.detach().to(torch::kFloat).cpu();
  const double scale = std::max(1.0, b.abs().max().item<double>());
  const double error = (a - b).abs().max().item<double>();
  require(error <= tolerance * scale, what + " differs from one process's by " + std::to_string(error));
}

}  // namespace

void check_fused_sync_batch_norm_matches_one_process(const std::shared_ptr<ProcessGroup>& pg,
                                                     const std::vector<int>& batches, torch::ScalarType dtype,
                                                     double tolerance, bool fused_kernels, torch::MemoryFormat layout) {
  const int rank = pg->rank();
  const auto on_device = torch::TensorOptions().device(pg->device());
  // An empty batch keeps NCHW strides, as an empty convolution's output has them.
  const auto mine = [&](const torch::Tensor& t) {
    const torch::Tensor here = t.to(on_device.dtype(dtype), /*non_blocking=*/false, /*copy=*/true);
    return t.numel() > 0 ? here.contiguous(layout) : here;
  };
  // That `y` came from libddp's kernels' autograd function if `fused_kernels`, else from ATen's ops.
  const auto require_made_as_expected = [&](const torch::Tensor& y, const std::string& what) {
    const bool by_kernels = y.grad_fn() && y.grad_fn()->name().find("FusedBatchNormFunction") != std::string::npos;
    require(by_kernels == fused_kernels,
            what + (fused_kernels ? "libddp's kernels did not run" : "unexpected kernels"));
  };
  std::vector<torch::Tensor> xs, rs, gs;
  for (int r = 0; r < static_cast<int>(batches.size()); ++r) {
    auto tensors = fused_batch_of(r, batches[static_cast<std::size_t>(r)], dtype);
    xs.push_back(tensors[0]);
    rs.push_back(tensors[1]);
    gs.push_back(tensors[2]);
  }
  std::int64_t first = 0;
  for (int r = 0; r < rank; ++r) first += batches[static_cast<std::size_t>(r)];
  const std::int64_t n = batches[static_cast<std::size_t>(rank)];
  const auto slice = [&](const torch::Tensor& whole) { return whole.narrow(0, first, n); };
  const torch::Tensor weight0 = torch::linspace(0.5, 1.5, kFusedChannels),
                      bias0 = torch::linspace(-0.3, 0.4, kFusedChannels);

  // One process in fp32: every batch at once, the sum of every rank's loss.
  const torch::Tensor all_x = torch::cat(xs).requires_grad_(true), all_r = torch::cat(rs).requires_grad_(true);
  const torch::Tensor ref_weight = weight0.clone().requires_grad_(true), ref_bias = bias0.clone().requires_grad_(true);
  torch::Tensor ref_mean = torch::zeros({kFusedChannels}), ref_var = torch::ones({kFusedChannels});
  const torch::Tensor expected =
      torch::relu(torch::batch_norm(all_x, ref_weight, ref_bias, ref_mean, ref_var, true, 0.2, 1e-5, false) + all_r);
  (expected * torch::cat(gs)).sum().backward();

  // This rank: its own batch through the fused, synchronised layer.
  const torch::Tensor x = mine(xs[static_cast<std::size_t>(rank)]).requires_grad_(true);
  const torch::Tensor residual = mine(rs[static_cast<std::size_t>(rank)]).requires_grad_(true);
  const torch::Tensor weight = weight0.to(on_device).requires_grad_(true),
                      bias = bias0.to(on_device).requires_grad_(true);
  torch::Tensor running_mean = torch::zeros({kFusedChannels}, on_device),
                running_var = torch::ones({kFusedChannels}, on_device);
  const torch::Tensor y = fused_batch_norm(x, weight, bias, running_mean, running_var, residual,
                                           FusedBatchNormOptions().momentum(0.2).relu(true).process_group(pg));
  (y.to(torch::kFloat) * gs[static_cast<std::size_t>(rank)].to(on_device)).sum().backward();
  const std::string at = "rank " + std::to_string(rank) + ", fused_batch_norm: ";
  auto& comm = pg->communicator();
  require_within(y, slice(expected), tolerance, at + "the output");
  require_within(x.grad(), slice(all_x.grad()), tolerance, at + "the input's gradient");
  require_made_as_expected(y, at);
  require(n == 0 || y.is_contiguous(layout), at + "the output is not in the input's memory format");
  require_within(residual.grad(), slice(all_r.grad()), tolerance, at + "the residual's gradient");
  require_within(summed_over_ranks(comm, weight.grad()), ref_weight.grad(), tolerance, at + "the weight's gradient");
  require_within(summed_over_ranks(comm, bias.grad()), ref_bias.grad(), tolerance, at + "the bias's gradient");
  require_within(running_mean, ref_mean, 1e-5, at + "the running mean");
  require_within(running_var, ref_var, 1e-5, at + "the running variance");

  // The module, its layers' way in: BatchNorm alone over the ranks' batches.
  SyncBatchNorm sync(torch::nn::BatchNormOptions(kFusedChannels).momentum(0.2), pg);
  sync->to(pg->device());
  const torch::Tensor module_x = mine(xs[static_cast<std::size_t>(rank)]).requires_grad_(true);
  const torch::Tensor module_y = sync(module_x);
  require_made_as_expected(module_y, "SyncBatchNorm: ");
  (module_y.to(torch::kFloat) * gs[static_cast<std::size_t>(rank)].to(on_device)).sum().backward();
  torch::nn::BatchNorm2d reference(torch::nn::BatchNorm2dOptions(kFusedChannels).momentum(0.2));
  const torch::Tensor module_all_x = torch::cat(xs).requires_grad_(true);
  (reference(module_all_x) * torch::cat(gs)).sum().backward();
  require_within(module_x.grad(), slice(module_all_x.grad()), tolerance,
                 "rank " + std::to_string(rank) + ", SyncBatchNorm: the input's gradient");
  require_within(summed_over_ranks(comm, sync->weight.grad()), reference->weight.grad(), tolerance,
                 "SyncBatchNorm: the weight's gradient");
  require_within(sync->running_var, reference->running_var, 1e-5, "SyncBatchNorm: the running variance");
}

}  // namespace ddp::testing
