#include "support/sparse_scenarios.h"

#include <string>

#include <torch/torch.h>

#include "support/collective_checks.h"
#include "support/multiprocess.h"

namespace ddp::testing {
namespace {

struct LookupNetImpl : torch::nn::Module {
  LookupNetImpl()
      : table(register_module("table", torch::nn::Embedding(torch::nn::EmbeddingOptions(20, 4).sparse(true)))),
        rare(register_module("rare", torch::nn::Embedding(torch::nn::EmbeddingOptions(10, 4).sparse(true)))),
        head(register_module("head", torch::nn::Linear(4, 1))) {}
  /// `rare` joins only when asked, so that a rank may leave it unused.
  torch::Tensor forward(const torch::Tensor& ids, bool use_rare) {
    torch::Tensor features = table(ids);
    if (use_rare) features = features + rare(ids.remainder(10));
    return head(features).squeeze(-1);
  }
  torch::nn::Embedding table, rare;
  torch::nn::Linear head;
};
TORCH_MODULE(LookupNet);

struct Batch {
  torch::Tensor ids, targets;
};

/// Rank `rank`'s batch of `step` on `device`: 8 ids (repeats included) and targets.
Batch batch_of(int rank, int step, const torch::Device& device) {
  auto generator = at::detail::createCPUGenerator(1000 * step + rank);
  return {torch::randint(0, 20, {8}, generator, torch::kLong).to(device), torch::randn({8}, generator).to(device)};
}

LookupNet make_net(const torch::Device& device) {
  torch::manual_seed(0);
  LookupNet net;
  net->to(device);
  return net;
}

}  // namespace

void check_sparse_matches_one_process(const std::shared_ptr<ProcessGroup>& pg, bool rare_on_rank0_only,
                                      bool accumulate) {
  const torch::Device device = pg->device();
  const int rank = pg->rank();
  LookupNet net = make_net(device);
  LookupNet single = make_net(device);
  DistributedDataParallel<LookupNet> model(net, pg,
                                           DistributedDataParallelOptions().find_unused_parameters(rare_on_rank0_only));
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.5));
  torch::optim::SGD single_optimizer(single->parameters(), torch::optim::SGDOptions(0.5));
  for (int step = 0; step < 3; ++step) {
    optimizer.zero_grad();
    const Batch mine = batch_of(rank, step, device);
    const bool use_rare = !rare_on_rank0_only || rank == 0;
    if (accumulate) {
      auto guard = model.no_sync();
      const Batch early = batch_of(rank, 100 + step, device);
      torch::mse_loss(model(early.ids, use_rare), early.targets).backward();
    }
    torch::mse_loss(model(mine.ids, use_rare), mine.targets).backward();

    // One process: each rank's mean loss, averaged, as DDP averages the ranks' gradients.
    single_optimizer.zero_grad();
    torch::Tensor loss = torch::zeros({}, device);
    for (int r = 0; r < 2; ++r) {
      const Batch b = batch_of(r, step, device);
      loss = loss + torch::mse_loss(single->forward(b.ids, !rare_on_rank0_only || r == 0), b.targets) / 2;
      if (accumulate) {
        const Batch early = batch_of(r, 100 + step, device);
        loss = loss + torch::mse_loss(single->forward(early.ids, !rare_on_rank0_only || r == 0), early.targets) / 2;
      }
    }
    loss.backward();

    require(net->table->weight.grad().is_sparse(), "the embedding's gradient is no longer sparse");
    const auto names = net->named_parameters();
    const auto expected = single->named_parameters();
    for (const auto& item : names) {
      const torch::Tensor got = item.value().grad();
      const torch::Tensor want = expected[item.key()].grad();
      require(got.defined() == want.defined(), item.key() + ": a gradient on one side only");
      if (!got.defined()) continue;
      const torch::Tensor got_dense = got.is_sparse() ? got.to_dense() : got;
      const torch::Tensor want_dense = want.is_sparse() ? want.to_dense() : want;
      require(torch::allclose(got_dense, want_dense, 1e-5, 1e-6),
              "step " + std::to_string(step) + ": " + item.key() + "'s gradient differs from one process's");
    }
    optimizer.step();
    single_optimizer.step();
  }
  for (const auto& item : net->named_parameters()) {
    require(torch::allclose(item.value(), single->named_parameters()[item.key()], 1e-5, 1e-6),
            item.key() + " differs from one process's after 3 steps");
  }
}

void check_sharding_refuses_sparse(const std::shared_ptr<ProcessGroup>& pg) {
  LookupNet net = make_net(pg->device());
  require_usage_error(
      [&] {
        DistributedDataParallel<LookupNet> model(net, pg,
                                                 DistributedDataParallelOptions().sharding(Sharding::kOptimizer));
      },
      "'table.weight' has sparse gradients");
}

}  // namespace ddp::testing
