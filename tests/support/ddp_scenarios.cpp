#include "support/ddp_scenarios.h"

#include <cmath>
#include <sstream>

#include <torch/torch.h>

#include "support/collective_checks.h"
#include "support/multiprocess.h"

namespace ddp::testing {
namespace {

constexpr std::int64_t kBatch = 4;  // samples per rank and micro-step

struct NetImpl : torch::nn::Module {
  NetImpl(Model kind, int second_width) : kind(kind) {
    if (kind == Model::kConvBatchNorm) {
      conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)));
      norm = register_module("norm", torch::nn::BatchNorm2d(8));
      head = register_module("head", torch::nn::Linear(8, 4));
    } else {
      trunk = register_module("trunk", torch::nn::Linear(16, second_width));
      head = register_module("head", torch::nn::Linear(second_width, 4));
      if (kind == Model::kBranchy) side = register_module("side", torch::nn::Linear(second_width, 4));
      // Registered last, so that its bucket is the first reduced.
      if (kind == Model::kViewedParameter) shift = register_parameter("shift", torch::randn({kBatch * 4}));
    }
  }

  torch::Tensor forward(torch::Tensor x, bool use_side) {
    if (kind == Model::kConvBatchNorm) {
      x = torch::relu(norm(conv(x)));
      return head(x.mean({2, 3}));
    }
    x = torch::tanh(trunk(x));
    torch::Tensor out = head(x);
    if (use_side && side) out = out + side(x);
    if (shift.defined()) out = out + shift.view({kBatch, 4});
    return out;
  }

  Model kind;
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d norm{nullptr};
  torch::nn::Linear trunk{nullptr}, head{nullptr}, side{nullptr};
  torch::Tensor shift;
};
TORCH_MODULE(Net);

Net make_net(Model kind, std::uint64_t seed, const c10::Device& device, bool channels_last, int width = 32) {
  torch::manual_seed(seed);
  Net net(kind, width);
  net->to(device);
  if (channels_last) {
    for (auto& p : net->parameters()) {
      if (p.dim() == 4) p.set_data(p.data().contiguous(at::MemoryFormat::ChannelsLast));
    }
  }
  return net;
}

struct Batch {
  torch::Tensor input, target;
  bool use_side;
};

Batch make_batch(Model kind, int step, int micro, int rank, const c10::Device& device, bool channels_last) {
  torch::manual_seed(10000 * step + 100 * micro + rank);
  Batch batch;
  if (kind == Model::kConvBatchNorm) {
    batch.input = torch::randn({kBatch, 3, 6, 6});
    if (channels_last) batch.input = batch.input.contiguous(at::MemoryFormat::ChannelsLast);
  } else {
    batch.input = torch::randn({kBatch, 16});
  }
  batch.target = torch::randn({kBatch, 4});
  batch.input = batch.input.to(device);
  batch.target = batch.target.to(device);
  batch.use_side = kind == Model::kBranchy && (step + rank) % 3 == 0;  // some steps no rank uses it
  return batch;
}

}  // namespace

double check_matches_single_process(ProcessGroup& pg, const Scenario& scenario, std::size_t* bucket_count) {
  const c10::Device device = pg.device();
  const int world = pg.world_size();
  // Each rank starts from different weights: DDP must copy rank 0's.
  DistributedDataParallel<Net> model(
      make_net(scenario.model, 100 + pg.rank(), device, scenario.channels_last, scenario.width),
      std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}), scenario.options);
  Net reference = make_net(scenario.model, 100, device, scenario.channels_last, scenario.width);
  if (scenario.load_after_wrapping) {
    std::stringstream bytes;
    torch::save(reference, bytes);
    torch::load(model.module(), bytes);
  }
  torch::optim::SGD optimizer(model.module()->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD reference_optimizer(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));

  for (int step = 0; step < scenario.steps; ++step) {
    optimizer.zero_grad();
    reference_optimizer.zero_grad();
    for (int micro = 0; micro < scenario.micro_steps; ++micro) {
      const Batch batch = make_batch(scenario.model, step, micro, pg.rank(), device, scenario.channels_last);
      auto run = [&] {
        torch::Tensor loss = torch::mse_loss(model(batch.input, batch.use_side), batch.target) / scenario.micro_steps;
        loss.backward();
      };
      if (micro + 1 < scenario.micro_steps) {
        auto guard = model.no_sync();
        run();
      } else {
        run();
      }
      for (int r = 0; r < world; ++r) {
        const Batch other = make_batch(scenario.model, step, micro, r, device, scenario.channels_last);
        torch::Tensor loss = torch::mse_loss(reference(other.input, other.use_side), other.target) /
                             (scenario.micro_steps * world);
        loss.backward();
      }
    }
    optimizer.step();
    reference_optimizer.step();
  }

  double worst = 0;
  const auto params = model.module()->named_parameters();
  const auto expected = reference->named_parameters();
  for (const auto& item : params) {
    const double diff = (item.value() - expected[item.key()]).abs().max().item<double>();
    require(std::isfinite(diff), "parameter " + item.key() + " is not finite");
    require(diff <= scenario.tolerance, "parameter " + item.key() + " differs from the single-process reference by " +
                                            std::to_string(diff) + " (tolerance " +
                                            std::to_string(scenario.tolerance) + ")");
    worst = std::max(worst, diff);
  }
  if (bucket_count != nullptr) *bucket_count = model.bucket_count();
  return worst;
}

void check_model_mismatch_is_reported(ProcessGroup& pg) {
  Net net = make_net(Model::kMlp, 1, pg.device(), false, pg.rank() == 1 ? 30 : 32);
  try {
    DistributedDataParallel<Net> model(net, std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}));
  } catch (const UsageError& e) {
    require_contains(e.what(), "the model differs between ranks");
    require_contains(e.what(),
                     "rank 1: #0: rank 0 has parameter 'trunk.weight' [32, 16] Float, rank 1 has "
                     "parameter 'trunk.weight' [30, 16] Float");
    return;
  }
  throw std::runtime_error("DDP accepted models that differ between ranks");
}

void check_unused_parameter_is_reported(ProcessGroup& pg) {
  DistributedDataParallel<Net> model(make_net(Model::kBranchy, 1, pg.device(), false),
                                     std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}));
  torch::Tensor input = torch::randn({4, 16}).to(pg.device());
  try {
    model(input, /*use_side=*/false).sum().backward();
  } catch (const UsageError& e) {
    require_contains(e.what(), "side.weight, side.bias");
    require_contains(e.what(), "find_unused_parameters(true)");
    return;
  } catch (const c10::Error& e) {
    // The autograd engine may wrap what a hook or callback throws.
    require_contains(e.what(), "side.weight, side.bias");
    require_contains(e.what(), "find_unused_parameters(true)");
    return;
  }
  throw std::runtime_error("backward succeeded although side.* received no gradient");
}

}  // namespace ddp::testing
