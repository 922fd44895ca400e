#include "support/sharding_scenarios.h"

#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>
#include <unordered_set>

#include <torch/torch.h>

#include "support/collective_checks.h"
#include "support/multiprocess.h"

namespace ddp::testing {
namespace {

constexpr std::int64_t kBatch = 4;  // samples per rank and micro-step

/// A module that owns no parameter of its own but registers another's: the
/// output layer that reuses an embedding's weight.
struct TiedImpl : torch::nn::Module {
  explicit TiedImpl(torch::Tensor shared) { weight = register_parameter("weight", std::move(shared)); }
  torch::Tensor weight;
};
TORCH_MODULE(Tied);

struct NetImpl : torch::nn::Module {
  NetImpl(ShardedModel kind, int width) {
    if (kind == ShardedModel::kTied) {
      embed = register_module("embed", torch::nn::Linear(16, 16));
      tied = register_module("tied", Tied(embed->weight));
    }
    trunk = register_module("trunk", torch::nn::Linear(16, width));
    head = register_module("head", torch::nn::Linear(width, 4));
    if (kind == ShardedModel::kBranchy) side = register_module("side", torch::nn::Linear(width, 4));
    if (kind == ShardedModel::kFrozen) trunk->weight.requires_grad_(false);
  }

  // Sharding::kFull gathers the modules shard_units names inside in_unit;
  // in the other modes in_unit just runs them.
  torch::Tensor forward(torch::Tensor x, bool use_side) {
    if (embed) {
      x = torch::nn::functional::linear(torch::tanh(ddp::in_unit(*embed, [&] { return embed(x); })), tied->weight);
    }
    x = torch::tanh(ddp::in_unit(*trunk, [&] { return trunk(x); }));
    torch::Tensor out = ddp::in_unit(*head, [&] { return head(x); });
    if (use_side && side) out = out + ddp::in_unit(*side, [&] { return side(x); });
    return out;
  }

  torch::nn::Linear embed{nullptr}, trunk{nullptr}, head{nullptr}, side{nullptr};
  Tied tied{nullptr};
};
TORCH_MODULE(Net);

Net make_net(const ShardingScenario& scenario, std::uint64_t seed, const c10::Device& device) {
  torch::manual_seed(seed);
  Net net(scenario.model, scenario.width);
  net->to(device);
  return net;
}

/// Each parameter once (a tied weight is listed under two names).
std::vector<torch::Tensor> unique_parameters(torch::nn::Module& module) {
  std::vector<torch::Tensor> unique;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& parameter : module.parameters()) {
    if (seen.insert(parameter.unsafeGetTensorImpl()).second) unique.push_back(parameter);
  }
  return unique;
}

/// AdamW with weight decay on matrices only: two groups, chosen on the
/// module's parameters and mapped through `local` (the identity, or a
/// sharded model's local_parameters).
std::unique_ptr<torch::optim::AdamW> make_adamw(
    torch::nn::Module& module, const std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>& local,
    bool fused = false) {
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& parameter : unique_parameters(module)) (parameter.dim() >= 2 ? decay : no_decay).push_back(parameter);
  const auto options = torch::optim::AdamWOptions(2e-2).betas({0.9, 0.99});
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(local(decay),
                      std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(options).weight_decay(0.1)));
  groups.emplace_back(local(no_decay),
                      std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(options).weight_decay(0)));
  if (fused) return std::make_unique<optim::FusedAdamW>(std::move(groups), options);
  return std::make_unique<torch::optim::AdamW>(std::move(groups), options);
}

struct Batch {
  torch::Tensor input, target;
  bool use_side;
};

/// `apart`: whether ranks may take the side branch apart (not in kFull,
/// where every rank must use the same parameters).
Batch make_batch(ShardedModel kind, int step, int micro, int rank, const c10::Device& device, bool apart = true) {
  torch::manual_seed(10000 * step + 100 * micro + rank);
  Batch batch{torch::randn({kBatch, 16}).to(device), torch::randn({kBatch, 4}).to(device), false};
  // Some steps no rank uses it.
  batch.use_side = kind == ShardedModel::kBranchy && (step + (apart ? rank : 0)) % 3 == 0;
  return batch;
}

std::shared_ptr<ProcessGroup> borrow(ProcessGroup& pg) { return {&pg, [](ProcessGroup*) {}}; }

/// `options` in `sharding`; kFull makes units of the embed (whose weight,
/// tied to a module outside it, stays gathered), the trunk, the head and the
/// side branch, which then runs on some steps only (on every rank alike):
/// the head's prefetch of it goes unused.
DistributedDataParallelOptions in_mode(DistributedDataParallelOptions options, Sharding sharding,
                                       ShardedModel kind = ShardedModel::kMlp, bool units_in_every_mode = false) {
  std::vector<std::string> units;
  if (sharding == Sharding::kFull || (units_in_every_mode && sharding != Sharding::kNone)) {
    units = {"trunk", "head"};
    if (kind == ShardedModel::kTied) units.push_back("embed");
    if (kind == ShardedModel::kBranchy) units.push_back("side");
  }
  return options.sharding(sharding).shard_units(units);
}

std::string scientific(double value) {
  std::ostringstream text;
  text << std::scientific << std::setprecision(2) << value;
  return text.str();
}

double max_difference(torch::nn::Module& got, torch::nn::Module& expected, const std::string& what,
                      double tolerance) {
  double worst = 0;
  const auto reference = expected.named_parameters();
  for (const auto& item : got.named_parameters()) {
    const double diff = (item.value() - reference[item.key()]).abs().max().item<double>();
    require(std::isfinite(diff), what + ": parameter " + item.key() + " is not finite");
    require(diff <= tolerance, what + ": parameter " + item.key() + " differs by " + scientific(diff) + " (tolerance " +
                                   scientific(tolerance) + ")");
    worst = std::max(worst, diff);
  }
  return worst;
}

}  // namespace

double check_sharded_matches(ProcessGroup& pg, const ShardingScenario& scenario) {
  const c10::Device device = pg.device();
  const int world = pg.world_size();
  auto options = scenario.options;
  // Each rank starts from different weights: DDP must copy rank 0's.
  DistributedDataParallel<Net> sharded(make_net(scenario, 100 + pg.rank(), device), borrow(pg),
                                       in_mode(options, scenario.sharding, scenario.model, scenario.units));
  DistributedDataParallel<Net> plain(make_net(scenario, 200 + pg.rank(), device), borrow(pg),
                                     in_mode(options, Sharding::kNone, scenario.model));
  {
    torch::NoGradGuard no_grad;  // plain starts from sharded's weights
    auto source = sharded.module()->named_parameters();
    for (auto& item : plain.module()->named_parameters()) item.value().copy_(source[item.key()]);
  }
  Net reference = make_net(scenario, 100, device);
  const bool fused = scenario.fused_optimizer;
  auto sharded_optimizer =
      make_adamw(*sharded.module(), [&](const auto& p) { return sharded.local_parameters(p); }, fused);
  auto plain_optimizer = make_adamw(*plain.module(), [](const auto& p) { return p; }, fused);
  auto reference_optimizer = make_adamw(*reference, [](const auto& p) { return p; }, fused);

  for (int step = 0; step < scenario.steps; ++step) {
    sharded_optimizer->zero_grad();
    plain_optimizer->zero_grad();
    reference_optimizer->zero_grad();
    for (int micro = 0; micro < scenario.micro_steps; ++micro) {
      const bool apart = scenario.sharding != Sharding::kFull;
      const Batch batch = make_batch(scenario.model, step, micro, pg.rank(), device, apart);
      for (auto* model : {&sharded, &plain}) {
        auto run = [&] {
          (torch::mse_loss((*model)(batch.input, batch.use_side), batch.target) / scenario.micro_steps).backward();
        };
        if (micro + 1 < scenario.micro_steps) {
          auto guard = model->no_sync();
          run();
        } else {
          run();
        }
      }
      for (int r = 0; r < world; ++r) {
        const Batch other = make_batch(scenario.model, step, micro, r, device, apart);
        (torch::mse_loss(reference(other.input, other.use_side), other.target) / (scenario.micro_steps * world))
            .backward();
      }
    }
    if (scenario.clip > 0) {
      const double sharded_norm = clip_grad_norm_(sharded, scenario.clip).item<double>();
      const double plain_norm = clip_grad_norm_(plain, scenario.clip).item<double>();
      const double reference_norm = torch::nn::utils::clip_grad_norm_(unique_parameters(*reference), scenario.clip);
      const double bound = std::max(1e-5, scenario.reference_tolerance) * reference_norm;
      require(std::abs(sharded_norm - plain_norm) <= 1e-6 * reference_norm &&
                  std::abs(sharded_norm - reference_norm) <= bound && std::abs(plain_norm - reference_norm) <= bound,
              "clip_grad_norm_: norms " + std::to_string(sharded_norm) + " (sharded) and " +
                  std::to_string(plain_norm) + " (plain) against " + std::to_string(reference_norm));
      require(reference_norm > scenario.clip, "the scenario's clip bound does not clip");
    }
    if (scenario.gather_before_step) sharded.gather_parameters();
    sharded_optimizer->step();
    plain_optimizer->step();
    reference_optimizer->step();
  }
  sharded.gather_parameters();
  const std::string mode = to_string(scenario.sharding);
  const double reference_tolerance = std::max(scenario.tolerance, scenario.reference_tolerance);
  max_difference(*plain.module(), *reference, "plain DDP against one process", reference_tolerance);
  max_difference(*sharded.module(), *plain.module(), mode + " against plain DDP", scenario.tolerance);
  return max_difference(*sharded.module(), *reference, mode + " against one process", reference_tolerance);
}

void check_every_mode_on_one_rank(ProcessGroup& pg, bool fused) {
  for (Sharding sharding : {Sharding::kOptimizer, Sharding::kGradients, Sharding::kFull}) {
    ShardingScenario scenario;
    scenario.sharding = sharding;
    scenario.fused_optimizer = fused;
    scenario.options.bucket_cap_mb(0.001).first_bucket_cap_mb(0.0005);
    check_sharded_matches(pg, scenario);
    scenario.model = ShardedModel::kBranchy;
    scenario.options.find_unused_parameters(true);
    scenario.micro_steps = 2;
    scenario.clip = 0.05;
    check_sharded_matches(pg, scenario);
  }
  check_memory_report(pg);
}

void check_memory_report(ProcessGroup& pg) {
  const int world = pg.world_size();
  const auto expect = [](bool condition, const std::string& what, const MemoryReport& report) {
    require(condition, what + ": " + report.to_string());
  };
  for (Sharding sharding : {Sharding::kNone, Sharding::kOptimizer, Sharding::kGradients, Sharding::kFull}) {
    ShardingScenario scenario;
    scenario.width = 301;  // 6k parameters in several buckets
    DistributedDataParallel<Net> model(
        make_net(scenario, 1, pg.device()), borrow(pg),
        in_mode(DistributedDataParallelOptions().bucket_cap_mb(0.004).first_bucket_cap_mb(0.004), sharding));
    auto optimizer = make_adamw(*model.module(), [&](const auto& p) { return model.local_parameters(p); });
    optimizer->zero_grad();
    const Batch batch = make_batch(scenario.model, 0, 0, pg.rank(), pg.device());
    torch::mse_loss(model(batch.input, false), batch.target).backward();
    optimizer->step();

    const MemoryReport report = model.memory_report(optimizer.get());
    const std::int64_t total = report.trained_elements;
    const std::int64_t full_bytes = total * 4;
    const std::int64_t slack = report.padding_elements;  // a rank's part may be short by at most the padding
    expect(total == 16 * 301 + 301 + 301 * 4 + 4, "trained elements", report);
    expect(report.optimizer_state_bytes == 2 * 4 * report.optimizer_elements, "AdamW state: two moments", report);
    if (sharding == Sharding::kNone) {
      expect(report.optimizer_elements == total && report.gradient_bytes == full_bytes &&
                 report.parameter_bytes == full_bytes && report.padding_elements == 0,
             "no sharding: everything whole", report);
      continue;
    }
    const auto buckets = static_cast<std::int64_t>(model.bucket_count());
    expect(buckets >= 2, "several buckets (" + std::to_string(buckets) + ")", report);
    expect(report.padding_elements > 0 && report.padding_elements < buckets * world * 64, "padding", report);
    expect(report.optimizer_elements <= (total + slack) / world && report.optimizer_elements >= total / world - slack,
           "optimizer elements at 1/N", report);
    const std::int64_t shard_bytes = (total + report.padding_elements) / world * 4;
    const std::int64_t padded_bytes = full_bytes + report.padding_elements * 4;
    if (sharding == Sharding::kFull && world > 1) {
      // Both layers are units: between iterations only their shards remain.
      expect(report.parameter_bytes == shard_bytes, "parameters at 1/N", report);
      expect(report.peak_gathered_bytes > 0 && report.peak_gathered_bytes <= padded_bytes, "gathered units", report);
    } else {
      // On one rank kFull keeps its units whole: a shard is the whole unit.
      expect(report.parameter_bytes == padded_bytes, "parameters whole", report);
      expect(report.peak_gathered_bytes == 0, "nothing gathered per unit", report);
    }
    if (world == 1) {
      expect(report.gradient_bytes == full_bytes, "one rank: the module's own gradients, as plain DDP", report);
    } else if (sharding != Sharding::kOptimizer) {
      expect(report.gradient_bytes == shard_bytes, "gradients at 1/N", report);
    } else {
      expect(report.gradient_bytes == shard_bytes + full_bytes + report.padding_elements * 4,
             "full gradient buckets and a shard", report);
    }
  }
}

namespace {

/// Six equal layers, each a unit of Sharding::kFull. Each runs in the dtype
/// its weight has (a unit gathered in bf16 takes bf16 inputs), as a model
/// without autocast must.
struct StackImpl : torch::nn::Module {
  StackImpl() {
    for (int i = 0; i < 6; ++i) layers->push_back(torch::nn::Linear(32, 32));
    register_module("layers", layers);
  }
  torch::Tensor forward(torch::Tensor x) {
    for (const auto& layer : *layers) {
      x = torch::tanh(ddp::in_unit(*layer, [&] {
        auto linear = layer->as<torch::nn::Linear>();
        unit_dtype = linear->weight.scalar_type();
        return linear->forward(x.to(unit_dtype)).to(x.scalar_type());
      }));
    }
    return x;
  }
  torch::nn::ModuleList layers;
  c10::ScalarType unit_dtype = at::kFloat;  ///< What the last unit's weight was when it ran.
};
TORCH_MODULE(Stack);

}  // namespace

void check_units_gather_one_at_a_time(ProcessGroup& pg, const UnitGathering& gathering) {
  const c10::Device device = pg.device();
  const auto make = [&](std::uint64_t seed) {
    torch::manual_seed(seed);
    Stack stack;
    stack->to(device);
    return stack;
  };
  auto options = DistributedDataParallelOptions().sharding(gathering.sharding).shard_units({"layers.*"});
  if (gathering.param_dtype) options.param_dtype(gathering.param_dtype);
  if (gathering.comm_hook) options.comm_hook(gathering.comm_hook);
  DistributedDataParallel<Stack> full(make(1 + pg.rank()), borrow(pg), options);
  Stack reference = make(1);
  // SGD: AdamW's normalised step would turn the ranks' different fp32 sum
  // orders into differences of up to its learning rate in near-zero gradients.
  auto optimizer = std::make_unique<torch::optim::SGD>(full.local_parameters(full.module()->parameters()),
                                                       torch::optim::SGDOptions(0.1));
  auto reference_optimizer = std::make_unique<torch::optim::SGD>(reference->parameters(), torch::optim::SGDOptions(0.1));
  const auto batch = [&](int step, int rank) {
    torch::manual_seed(700 + 10 * step + rank);
    return torch::randn({kBatch, 32}).to(device);
  };
  const c10::ScalarType unit_dtype = gathering.param_dtype.value_or(at::kFloat);
  for (int step = 0; step < 3; ++step) {
    optimizer->zero_grad();
    reference_optimizer->zero_grad();
    full(batch(step, pg.rank())).pow(2).mean().backward();
    require(full.module()->unit_dtype == unit_dtype,
            std::string("units ran in ") + c10::toString(full.module()->unit_dtype));
    for (int r = 0; r < pg.world_size(); ++r) (reference(batch(step, r)).pow(2).mean() / pg.world_size()).backward();
    optimizer->step();
    reference_optimizer->step();
  }
  for (const auto& group : optimizer->param_groups()) {
    for (const auto& master : group.params()) {
      require(master.scalar_type() == at::kFloat && master.grad().scalar_type() == at::kFloat,
              std::string("the optimizer steps ") + c10::toString(master.scalar_type()) + " shards");
    }
  }
  if (gathering.sharding == Sharding::kFull) {
    const MemoryReport report = full.memory_report(optimizer.get());
    const std::int64_t unit_bytes = (32 * 32 + 32 + report.padding_elements / 6) * c10::elementSize(unit_dtype);
    // The unit running and the next, prefetched: in forward the one before is
    // freed as the next starts; in backward once its gradients are all in.
    require(report.peak_gathered_bytes >= unit_bytes && report.peak_gathered_bytes <= 2 * unit_bytes,
            "at most two of six units gathered at once: " + std::to_string(report.peak_gathered_bytes) + " bytes, " +
                std::to_string(unit_bytes) + " per unit");
  }
  // The masters, whole on rank 0, in the parameters' own dtype.
  torch::serialize::OutputArchive archive;
  full.save_module(archive);
  // What the units compute with: the masters in the gathered dtype, on every
  // rank within the masters' tolerance of one process's; on rank 0 exactly
  // the cast of the masters it saved.
  full.gather_parameters();
  for (const auto& item : full.module()->named_parameters()) {
    const at::Tensor expected = reference->named_parameters()[item.key()].to(unit_dtype);
    require(item.value().scalar_type() == unit_dtype, item.key() + " is not gathered in the param_dtype");
    const double diff = (item.value().to(at::kFloat) - expected.to(at::kFloat)).abs().max().item<double>();
    // bf16 of equal masters is equal; masters within tolerance differ by at most one rounding step more.
    const double rounding = unit_dtype == at::kFloat ? 0 : expected.abs().max().item<double>() / 128;
    require(diff <= gathering.tolerance + rounding,
            "gathered " + item.key() + " differs from the reference by " + scientific(diff));
  }
  if (pg.rank() == 0) {
    std::stringstream bytes;
    archive.save_to(bytes);
    Stack masters = make(99);
    torch::load(masters, bytes);  // onto the archive's host tensors
    masters->to(device);
    for (const auto& item : full.module()->named_parameters()) {
      const at::Tensor expected = masters->named_parameters()[item.key()].to(unit_dtype);
      require(item.value().equal(expected),
              "gathered " + item.key() + " is not its master in " + c10::toString(unit_dtype) + ": they differ by " +
                  scientific((item.value().to(at::kFloat) - expected.to(at::kFloat)).abs().max().item<double>()));
    }
    max_difference(*masters, *reference, to_string(gathering.sharding) + " sharding of a stack against one process",
                   gathering.tolerance);
  }
  // Loading writes the masters; the next gather casts them into the units.
  std::stringstream saved;
  torch::serialize::OutputArchive out;
  reference->save(out);
  out.save_to(saved);
  torch::serialize::InputArchive in;
  in.load_from(saved);
  DistributedDataParallel<Stack> restored(make(50 + pg.rank()), borrow(pg), options);
  restored.load_module(in);
  restored.gather_parameters();
  for (const auto& item : restored.module()->named_parameters()) {
    const at::Tensor expected = reference->named_parameters()[item.key()].to(unit_dtype);
    require(item.value().equal(expected),
            "after load_module, gathered " + item.key() + " is not the loaded value in " + c10::toString(unit_dtype));
  }
}

namespace {

constexpr std::int64_t kGlobalBatch = 12;

/// Step `step`'s global batch; `rank` of `world` takes its even share.
Batch global_batch_part(int step, int rank, int world, const c10::Device& device) {
  torch::manual_seed(500 + step);
  Batch whole{torch::randn({kGlobalBatch, 16}), torch::randn({kGlobalBatch, 4}), false};
  const std::int64_t share = kGlobalBatch / world;
  return {whole.input.narrow(0, rank * share, share).to(device), whole.target.narrow(0, rank * share, share).to(device),
          false};
}

struct Trained {
  std::unique_ptr<DistributedDataParallel<Net>> model;
  std::unique_ptr<torch::optim::AdamW> optimizer;
};

Trained make_trained(ProcessGroup& pg, Sharding sharding) {
  ShardingScenario scenario;
  Trained trained;
  trained.model = std::make_unique<DistributedDataParallel<Net>>(
      make_net(scenario, 7, pg.device()), borrow(pg),
      in_mode(DistributedDataParallelOptions().bucket_cap_mb(0.001).first_bucket_cap_mb(0.0005), sharding));
  // On a GPU the fused kernel keeps the state (FusedAdamW's is AdamW's).
  trained.optimizer = make_adamw(
      *trained.model->module(), [&](const auto& p) { return trained.model->local_parameters(p); },
      pg.device().is_cuda());
  return trained;
}

void train_steps(ProcessGroup& pg, Trained& trained, int from, int to) {
  for (int step = from; step < to; ++step) {
    trained.optimizer->zero_grad();
    const Batch batch = global_batch_part(step, pg.rank(), pg.world_size(), pg.device());
    torch::mse_loss((*trained.model)(batch.input, false), batch.target).backward();
    trained.optimizer->step();
  }
}

}  // namespace

void save_after_steps(ProcessGroup& pg, Sharding sharding, int steps, const std::string& path,
                      CheckpointFormat format) {
  Trained trained = make_trained(pg, sharding);
  train_steps(pg, trained, 0, steps);
  if (format == CheckpointFormat::kSharded) {
    trained.model->save_sharded_checkpoint(path, trained.optimizer.get(), [&](torch::serialize::OutputArchive& extra) {
      extra.write("steps", c10::IValue(static_cast<std::int64_t>(steps)));
    });
    return;
  }
  torch::serialize::OutputArchive model_archive, optimizer_archive;
  trained.model->save_module(model_archive);  // gathered bucket by bucket, whatever the module holds
  trained.model->save_optimizer_state(*trained.optimizer, optimizer_archive);
  checkpoint::save_on_rank0(pg, path, [&](torch::serialize::OutputArchive& archive) {
    archive.write("model", model_archive);
    archive.write("optimizer", optimizer_archive);
  });
}

void check_resume_matches(ProcessGroup& pg, Sharding sharding, int steps, const std::string& path,
                          CheckpointFormat format) {
  Trained trained = make_trained(pg, sharding);
  if (format == CheckpointFormat::kSharded) {
    trained.model->load_sharded_checkpoint(path, trained.optimizer.get(), [&](torch::serialize::InputArchive& extra) {
      c10::IValue saved_steps;
      extra.read("steps", saved_steps);
      if (saved_steps.toInt() != steps) throw std::runtime_error("the checkpoint's extra state did not come back");
    });
  } else {
    torch::serialize::InputArchive archive, model_archive, optimizer_archive;
    checkpoint::load(archive, path);
    archive.read("model", model_archive);
    archive.read("optimizer", optimizer_archive);
    trained.model->load_module(model_archive);
    trained.model->load_optimizer_state(*trained.optimizer, optimizer_archive);
  }
  train_steps(pg, trained, steps, steps + 1);
  trained.model->gather_parameters();

  ShardingScenario scenario;
  Net reference = make_net(scenario, 7, pg.device());
  auto reference_optimizer = make_adamw(*reference, [](const auto& p) { return p; }, pg.device().is_cuda());
  for (int step = 0; step <= steps; ++step) {
    reference_optimizer->zero_grad();
    const Batch batch = global_batch_part(step, 0, 1, pg.device());
    torch::mse_loss(reference(batch.input, false), batch.target).backward();
    reference_optimizer->step();
  }
  max_difference(*trained.model->module(), *reference,
                 "resumed in " + to_string(sharding) + " at " + std::to_string(pg.world_size()) + " ranks", 1e-6);
}

void check_grad_scaler_agrees(ProcessGroup& pg, Sharding sharding) {
  ShardingScenario scenario;
  DistributedDataParallel<Net> model(make_net(scenario, 1, pg.device()), borrow(pg),
                                     in_mode(DistributedDataParallelOptions(), sharding));
  auto optimizer = make_adamw(*model.module(), [&](const auto& p) { return model.local_parameters(p); });
  GradScaler scaler(GradScalerOptions().init_scale(256), borrow(pg));
  for (int step = 0; step < 3; ++step) {
    optimizer->zero_grad();
    const Batch batch = make_batch(scenario.model, step, 0, pg.rank(), pg.device());
    scaler.scale(torch::mse_loss(model(batch.input, false), batch.target)).backward();
    const bool poison = step == 1 && pg.rank() == 0;  // an inf in rank 0's shard only
    if (poison) {
      torch::NoGradGuard no_grad;
      model.parameters().front().grad()[0] = std::numeric_limits<float>::infinity();
    }
    model.gather_parameters();  // kFull frees units' parameters after backward
    const auto before = model.module()->head->weight.clone();
    const bool stepped = scaler.step(*optimizer);
    scaler.update();
    require(stepped == (step != 1), "step " + std::to_string(step) + ": stepped " + std::to_string(stepped) +
                                        " on rank " + std::to_string(pg.rank()));
    model.gather_parameters();
    if (!stepped) require(torch::equal(before, model.module()->head->weight), "a skipped step changed the weights");
  }
  require(scaler.get_scale() == 128, "the scale backed off once: " + std::to_string(scaler.get_scale()));
  // Every rank holds the same weights.
  at::Tensor weights = torch::cat({model.module()->trunk->weight.flatten(), model.module()->head->weight.flatten()});
  at::Tensor all = torch::empty({pg.world_size() * weights.numel()}, weights.options());
  pg.communicator().all_gather(all, weights)->wait();
  for (int r = 1; r < pg.world_size(); ++r) {
    require(torch::equal(all.narrow(0, 0, weights.numel()), all.narrow(0, r * weights.numel(), weights.numel())),
            "rank " + std::to_string(r) + " holds other weights than rank 0");
  }
}

}  // namespace ddp::testing
