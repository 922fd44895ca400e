// One DDP step of a small Linear, run by tests/package/check_install.sh under
// the installed ddprun. Exits non-zero unless every rank ends the step with
// the same parameters and with the gradient averaged over every rank's batch.
#include <cstdio>
#include <exception>

#include <ddp/ddp.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

namespace {

// Rank r's batch: different on every rank, so that the average differs from each local gradient.
torch::Tensor batch_of(int rank) {
  return torch::arange(24, torch::kFloat).reshape({6, 4}).mul(0.1 * (rank + 1)).sin();
}

torch::Tensor loss_of(const torch::Tensor& output) { return output.pow(2).mean(); }

// Every rank's copy of `tensor`, gathered: [world_size, numel].
torch::Tensor gather(ddp::ProcessGroup& pg, const torch::Tensor& tensor) {
  auto flat = tensor.detach().reshape({-1}).contiguous();
  auto all = torch::empty({pg.world_size() * flat.numel()}, flat.options());
  pg.communicator().all_gather(all, flat)->wait();
  return all.reshape({pg.world_size(), flat.numel()});
}

bool same_on_every_rank(ddp::ProcessGroup& pg, const torch::Tensor& tensor) {
  auto all = gather(pg, tensor);
  return torch::equal(all, all[0].expand_as(all));
}

}  // namespace

int main() {
  try {
    auto pg = ddp::init();
    const int rank = pg->rank();
    // A different initialisation on every rank: DDP must start them all from rank 0's.
    torch::manual_seed(1000 + rank);
    torch::nn::Linear net(4, 3);
    net->to(pg->device());
    auto model = ddp::DistributedDataParallel<torch::nn::Linear>(net, pg);
    torch::optim::SGD optimizer(model.module()->parameters(), 0.1);

    // The averaged gradient, computed locally from every rank's batch.
    auto weight = model.module()->weight.detach().clone().requires_grad_();
    auto bias = model.module()->bias.detach().clone().requires_grad_();
    for (int r = 0; r < pg->world_size(); ++r) {
      auto output = torch::nn::functional::linear(batch_of(r).to(pg->device()), weight, bias);
      (loss_of(output) / pg->world_size()).backward();
    }

    optimizer.zero_grad();
    loss_of(model(batch_of(rank).to(pg->device()))).backward();
    bool ok = true;
    if (!torch::allclose(model.module()->weight.grad(), weight.grad(), 1e-5, 1e-6) ||
        !torch::allclose(model.module()->bias.grad(), bias.grad(), 1e-5, 1e-6)) {
      std::fprintf(stderr, "consumer: rank %d: the gradient is not the average over the ranks' batches\n", rank);
      ok = false;
    }
    optimizer.step();
    for (const auto& parameter : model.module()->parameters()) {
      if (!same_on_every_rank(*pg, parameter)) {
        std::fprintf(stderr, "consumer: rank %d: parameters differ across ranks after the step\n", rank);
        ok = false;
      }
    }
    if (!ok) return 1;
    std::printf("consumer: rank %d of %d: gradients averaged, parameters agree after one step\n", rank,
                pg->world_size());
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "consumer: %s\n", error.what());
    return 1;
  }
}
