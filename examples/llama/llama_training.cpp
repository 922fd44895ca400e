#include "llama_training.h"

#include <stdexcept>
#include <string>
#include <vector>

#include <ddp/errors.h>

#include "fused_ops.h"

namespace llama {

void use_reference_ops(LlamaConfig& config) {
  config.fused_kernels = false;
  config.repeat_kv_heads = true;
  config.fp32_weight_gradients = false;
  config.fused_qkv = false;
}

ddp::float8::Report enable_float8_training(LlamaImpl& model, ddp::Float8Scaling scaling,
                                           bool fast_accumulation_forward) {
  return ddp::float8::enable_float8(model,
                                    ddp::Float8Options().scaling(scaling).fast_accumulation_forward(
                                        fast_accumulation_forward),
                                    [](const std::string& path, const ddp::Float8LinearImpl&) { return path != "output"; });
}

ddp::Float8Scaling float8_scaling_named(const std::string& name) {
  if (name == "current") return ddp::Float8Scaling::kCurrent;
  if (name == "delayed") return ddp::Float8Scaling::kDelayed;
  throw std::invalid_argument("--fp8-scaling must be current or delayed, got '" + name + "'");
}

ddp::DistributedDataParallelOptions sharding_options(const std::string& sharding_name, const std::string& param_dtype,
                                                     const ddp::PrecisionPolicy& policy) {
  ddp::Sharding sharding = ddp::Sharding::kNone;
  try {
    sharding = ddp::parse_sharding(sharding_name);
  } catch (const ddp::UsageError& e) {
    throw std::invalid_argument(e.what());
  }
  auto options = ddp::DistributedDataParallelOptions().sharding(sharding);
  if (param_dtype != "fp32" && param_dtype != "bf16") {
    throw std::invalid_argument("--param-dtype must be fp32 or bf16, got '" + param_dtype + "'");
  }
  if (param_dtype == "bf16" && sharding == ddp::Sharding::kNone) {
    throw std::invalid_argument("--param-dtype bf16 needs a sharded mode: --sharding optimizer, gradients or full");
  }
  if (param_dtype == "bf16" && policy.autocast_dtype() != at::kBFloat16) {
    throw std::invalid_argument(
        "--param-dtype bf16 computes the blocks under bf16 autocast: use --precision bf16 or fp8");
  }
  if (sharding == ddp::Sharding::kNone) return options;
  // kFull gathers each block while it runs; ZeRO-1/2 wait for each block's gather at its entry.
  options.shard_units({"layers.*"});
  if (param_dtype == "bf16") options.param_dtype(at::kBFloat16);
  return options;
}

std::unique_ptr<ddp::optim::FusedAdamW> make_adamw(const ddp::DistributedDataParallel<Llama>& model, double lr,
                                                   double beta2, double weight_decay) {
  std::vector<at::Tensor> decay, no_decay;
  for (auto& param : model.module()->parameters()) (param.dim() >= 2 ? decay : no_decay).push_back(param);
  const auto adamw = torch::optim::AdamWOptions(lr).betas({0.9, beta2});
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(model.local_parameters(decay),
                      std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(adamw).weight_decay(weight_decay)));
  groups.emplace_back(model.local_parameters(no_decay),
                      std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(adamw).weight_decay(0)));
  return std::make_unique<ddp::optim::FusedAdamW>(std::move(groups), adamw);
}

at::Tensor next_token_loss(const at::Tensor& logits, const at::Tensor& targets, bool fused) {
  return ops::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}), fused);
}

}  // namespace llama
