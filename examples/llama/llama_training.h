#pragma once

// How this project trains a LLaMA decoder, shared by train_llama and the
// scaling benchmark so that the benchmark measures exactly what the example runs.

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <ddp/distributed_data_parallel.h>
#include <ddp/float8.h>
#include <ddp/optim.h>
#include <ddp/precision.h>

#include "llama_model.h"

namespace llama {

/// The ATen ops of PyTorch's reference model everywhere (the --unfused
/// flag): no fused kernels, three q, k, v layers, repeated key/value heads, torch::nn::Linear's
/// weight gradients; next_token_loss then takes fused = config.fused_kernels.
void use_reference_ops(LlamaConfig& config);

/// FP8 in every linear layer but the output head, which stays in bf16 as
/// Transformer Engine and torchao recommend: its logits feed the softmax
/// directly. `scaling` and `fast_accumulation_forward`: the recipe, with
/// Float8Options' defaults for the rest.
ddp::float8::Report enable_float8_training(LlamaImpl& model, ddp::Float8Scaling scaling,
                                           bool fast_accumulation_forward);

/// "current" or "delayed", the value of the --fp8-scaling flag; throws
/// std::invalid_argument otherwise.
ddp::Float8Scaling float8_scaling_named(const std::string& name);

/// DDP's options for the --sharding and --param-dtype flags: in the sharded
/// modes each transformer block is a unit (as FSDP wraps each block; kFull
/// gathers it while it runs, kOptimizer and kGradients wait for its gather
/// at its entry), under kFull gathered in `param_dtype` ("fp32", or "bf16":
/// FSDP's param_dtype, which needs `policy`'s bf16 autocast). Throws
/// std::invalid_argument naming the bad flag.
ddp::DistributedDataParallelOptions sharding_options(const std::string& sharding, const std::string& param_dtype,
                                                     const ddp::PrecisionPolicy& policy);

/// AdamW (fused where LibTorch has the kernel) with weight decay on matrices
/// only, not on norms, over what `model` says this rank steps (its shards of
/// the parameters when sharded).
std::unique_ptr<ddp::optim::FusedAdamW> make_adamw(const ddp::DistributedDataParallel<Llama>& model, double lr,
                                                   double beta2, double weight_decay);

/// Mean cross entropy of predicting `targets` [batch, seq] from `logits`
/// [batch, seq, vocab], computed in fp32 whatever the logits' dtype; `fused`:
/// ops::cross_entropy's kernels where they apply.
at::Tensor next_token_loss(const at::Tensor& logits, const at::Tensor& targets, bool fused = true);

}  // namespace llama
