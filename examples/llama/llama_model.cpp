#include "llama_model.h"

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/version.h>

#include <ddp/distributed_data_parallel.h>
#include <ddp/precision.h>
#include <ddp/rms_norm.h>

#include "fused_ops.h"

namespace llama {
namespace {

constexpr double kInitStd = 0.02;

const LlamaConfig& checked(const LlamaConfig& config) {
  const std::pair<const char*, std::int64_t> sizes[] = {
      {"vocab_size", config.vocab_size}, {"dim", config.dim},
      {"n_layers", config.n_layers},     {"n_heads", config.n_heads},
      {"n_kv_heads", config.n_kv_heads}, {"ffn_hidden", config.ffn_hidden},
      {"max_seq_len", config.max_seq_len}};
  for (const auto& [name, value] : sizes) {
    if (value < 1) throw std::invalid_argument(std::string("LlamaConfig: ") + name + " must be positive");
  }
  if (config.dim % config.n_heads != 0 || config.n_heads % config.n_kv_heads != 0) {
    throw std::invalid_argument("LlamaConfig: dim (" + std::to_string(config.dim) + ") must be a multiple of n_heads (" +
                                std::to_string(config.n_heads) + "), and n_heads of n_kv_heads (" +
                                std::to_string(config.n_kv_heads) + ")");
  }
  if (config.head_dim() % 2 != 0) {
    throw std::invalid_argument("LlamaConfig: dim / n_heads (" + std::to_string(config.head_dim()) +
                                ") must be even: rotary embeddings rotate pairs of features");
  }
  return config;
}

ddp::Float8Linear linear(std::int64_t in_features, std::int64_t out_features, bool fp32_weight_gradients) {
  return ddp::Float8Linear(torch::nn::LinearOptions(in_features, out_features).bias(false),
                           ddp::Float8Options().enabled(false).fp32_weight_gradients(fp32_weight_gradients));
}

// LibTorch 2.5 gave scaled_dot_product_attention grouped key/value heads (enable_gqa).
#define LLAMA_SDPA_GROUPS_HEADS (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5))

// q [batch, heads, seq, head_dim]; k and v with as many heads as q, or (where
// SDPA groups heads) with a divisor of that many, each serving a group of
// consecutive query heads.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
#if LLAMA_SDPA_GROUPS_HEADS
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true,
                                          /*scale=*/std::nullopt, /*enable_gqa=*/k.size(1) != q.size(1));
#elif TORCH_VERSION_MAJOR >= 2  // at::scaled_dot_product_attention arrived in LibTorch 2.0
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
#else
  const std::int64_t seq = q.size(-2);
  const torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  const torch::Tensor future = torch::ones({seq, seq}, q.options().dtype(torch::kBool)).triu(1);
  // Softmax in fp32, as SDPA does under autocast.
  const torch::Tensor weights =
      torch::softmax(scores.masked_fill(future, -std::numeric_limits<double>::infinity()), -1, torch::kFloat);
  return torch::matmul(weights.to(q.scalar_type()), v);
#endif
}

// What backward needs to rerun a checkpointed block: the block (with the
// rotation of the sequence), its parameters, and the autocast state of the
// original forward, which backward, usually outside the autocast region, must
// reproduce to compute the same thing.
struct Recompute : torch::CustomClassHolder {
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::vector<torch::Tensor> parameters;
  c10::DeviceType device_type = c10::DeviceType::CPU;
  ddp::AutocastState autocast;
};

// Activation checkpointing; LibTorch has no torch.utils.checkpoint. Forward
// keeps only the block's input; backward reruns the block with grad enabled
// and differentiates that. The blocks draw no random numbers (no dropout), so
// the rerun computes exactly what the forward did and the gradients are those
// of the plain model. The parameters are inputs of this function, so their
// gradients reach their AccumulateGrad nodes (and DDP's hooks there) once,
// through the outer backward.
struct CheckpointedBlock : torch::autograd::Function<CheckpointedBlock> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               at::TensorList /*parameters: only to connect their gradients*/,
                               const c10::intrusive_ptr<Recompute>& recompute) {
    // Function::apply runs this with grad mode off, so the block keeps no activations.
    ctx->save_for_backward({x});
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(recompute);
    return recompute->forward(x);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const torch::Tensor saved_x = ctx->get_saved_variables().at(0);
    const auto recompute = c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data["recompute"].toCapsule());
    const torch::Tensor x = saved_x.detach().requires_grad_(saved_x.requires_grad());

    // One gradient per input of forward: x, each parameter, and none for the Recompute.
    std::vector<torch::Tensor> inputs{x};
    inputs.insert(inputs.end(), recompute->parameters.begin(), recompute->parameters.end());
    std::vector<torch::Tensor> differentiable;
    for (const auto& input : inputs) {
      if (input.requires_grad()) differentiable.push_back(input);
    }
    torch::Tensor output;
    {
      torch::AutoGradMode grad_mode(true);
      ddp::AutocastStateGuard autocast(recompute->device_type, recompute->autocast);
      output = recompute->forward(x);
    }
    const auto grads = torch::autograd::grad({output}, differentiable, {grad_outputs.at(0)});

    torch::autograd::variable_list result(inputs.size() + 1);
    for (std::size_t i = 0, next = 0; i < inputs.size(); ++i) {
      if (inputs[i].requires_grad()) result[i] = grads[next++];
    }
    return result;
  }
};

// {x + delta, norm(x + delta)}: `fused`, one kernel where it applies
// (ddp::add_rms_norm); else the add and then the norm. `writer`: the layer
// whose output delta is, whose FP8 output gradient the fused backward then
// writes; `reader`: the one layer that reads the norm, with those sharing its
// input cast (RMSNormImpl::forward_into). Either may be null.
std::pair<torch::Tensor, torch::Tensor> add_and_norm(const torch::Tensor& x, const torch::Tensor& delta,
                                                     ddp::Float8LinearImpl* writer, RMSNormImpl& norm, bool fused,
                                                     ddp::Float8LinearImpl* reader) {
  if (fused) {
    const auto options = ddp::RMSNormOptions().eps(norm.eps);
    return ddp::float8::add_rms_norm(x, delta, writer, norm.weight, reader, options);
  }
  torch::Tensor sum = x + delta;
  torch::Tensor normed = norm.forward_into(sum, reader);
  return {std::move(sum), std::move(normed)};
}

torch::Tensor checkpointed(const std::shared_ptr<TransformerBlockImpl>& block, const torch::Tensor& x,
                           const Rotation& rotation) {
  auto recompute = c10::make_intrusive<Recompute>();
  recompute->forward = [block, rotation](const torch::Tensor& input) { return block->forward(input, rotation); };
  recompute->parameters = block->parameters();
  recompute->device_type = x.device().type();
  recompute->autocast = ddp::AutocastState::current(recompute->device_type);
  return CheckpointedBlock::apply(x, at::TensorList(recompute->parameters), recompute);
}

}  // namespace

LlamaConfig LlamaConfig::preset(const std::string& name) {
  // vocab_size, dim, n_layers, n_heads, n_kv_heads, ffn_hidden, max_seq_len
  const std::pair<const char*, LlamaConfig> presets[] = {
      // Byte-level; FFN as LLaMA sizes it, 2/3 of 4 * dim rounded up to a multiple of 16.
      {"tiny", {256, 64, 2, 4, 2, 176, 64}},
      {"tinyllama-1.1b", {32000, 2048, 22, 32, 4, 5632, 2048}},
      {"llama2-7b", {32000, 4096, 32, 32, 32, 11008, 4096}},
  };
  std::string names;
  for (const auto& [preset_name, config] : presets) {
    if (name == preset_name) return config;
    names += names.empty() ? preset_name : std::string(", ") + preset_name;
  }
  throw std::invalid_argument("unknown LLaMA preset '" + name + "' (valid: " + names + ")");
}

std::int64_t LlamaConfig::parameter_count() const {
  const std::int64_t kv_dim = n_kv_heads * head_dim();
  const std::int64_t attention = 2 * dim * dim + 2 * dim * kv_dim;  // wq, wo; wk, wv
  const std::int64_t feed_forward = 3 * dim * ffn_hidden;           // w1, w2, w3
  const std::int64_t block = attention + feed_forward + 2 * dim;    // and two norms
  const std::int64_t embeddings = vocab_size * dim * (tie_embeddings ? 1 : 2);
  return embeddings + n_layers * block + dim;  // and the final norm
}

RMSNormImpl::RMSNormImpl(std::int64_t dim, double eps, bool fused) : eps(eps), fused(fused) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  return ddp::rms_norm(x, weight, ddp::RMSNormOptions().eps(eps).fused(fused));
}

torch::Tensor RMSNormImpl::forward_into(const torch::Tensor& x, ddp::Float8LinearImpl* reader) {
  if (reader == nullptr) return forward(x);
  return ddp::float8::rms_norm(x, weight, *reader, ddp::RMSNormOptions().eps(eps).fused(fused));
}

torch::Tensor Rotation::apply(const torch::Tensor& x) const { return ops::rotate_pairs(x, cos, sin, fused); }

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> Rotation::split_qkv(const torch::Tensor& qkv,
                                                                            std::int64_t heads, std::int64_t kv_heads,
                                                                            ddp::Float8LinearImpl* producer) const {
  return ops::split_rotate_qkv(qkv, cos, sin, heads, kv_heads, fused, producer);
}

RotaryEmbedding::RotaryEmbedding(std::int64_t head_dim, std::int64_t max_seq_len, double theta) {
  const auto float64 = torch::TensorOptions().dtype(torch::kDouble);
  const torch::Tensor inverse_frequencies =
      1.0 / torch::pow(theta, torch::arange(0, head_dim, 2, float64) / static_cast<double>(head_dim));
  const torch::Tensor angles = torch::outer(torch::arange(max_seq_len, float64), inverse_frequencies);
  cos_ = angles.cos().to(torch::kFloat);
  sin_ = angles.sin().to(torch::kFloat);
}

Rotation RotaryEmbedding::rotation(std::int64_t seq_len, const c10::Device& device, bool fused) {
  TORCH_CHECK(seq_len <= cos_.size(0), "sequence of ", seq_len, " tokens, longer than max_seq_len (", cos_.size(0),
              ")");
  if (cos_.device() != device) {
    cos_ = cos_.to(device);
    sin_ = sin_.to(device);
  }
  return {cos_.narrow(0, 0, seq_len), sin_.narrow(0, 0, seq_len), fused};
}

AttentionImpl::AttentionImpl(const LlamaConfig& config)
    : n_heads(config.n_heads),
      n_kv_heads(config.n_kv_heads),
      head_dim(config.head_dim()),
      repeat_kv_heads(config.repeat_kv_heads) {
  const bool fp32_grads = config.fp32_weight_gradients;
  if (config.fused_qkv) {
    wqkv = register_module("wqkv", linear(config.dim, (n_heads + 2 * n_kv_heads) * head_dim, fp32_grads));
  } else {
    wq = register_module("wq", linear(config.dim, n_heads * head_dim, fp32_grads));
    wk = register_module("wk", linear(config.dim, n_kv_heads * head_dim, fp32_grads));
    wv = register_module("wv", linear(config.dim, n_kv_heads * head_dim, fp32_grads));
    // In FP8 the normalised input is cast once for the three projections.
    ddp::float8::share_input_cast({wq.get(), wk.get(), wv.get()});
  }
  wo = register_module("wo", linear(n_heads * head_dim, config.dim, fp32_grads));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const Rotation& rotation) {
  const std::int64_t batch = x.size(0);
  const std::int64_t seq = x.size(1);
  torch::Tensor q, k, v;
  if (wqkv) {
    std::tie(q, k, v) = rotation.split_qkv(wqkv(x), n_heads, n_kv_heads, wqkv.get());
  } else {
    q = rotation.apply(wq(x).view({batch, seq, n_heads, head_dim}));
    k = rotation.apply(wk(x).view({batch, seq, n_kv_heads, head_dim}));
    v = wv(x).view({batch, seq, n_kv_heads, head_dim});
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  v = v.transpose(1, 2);
  // Repeated heads cost a copy of k and v per block and, in backward, the sums
  // of their gradients: 3.1 ms of a LLaMA-1.1B bf16 step's 121.6 ms of GPU
  // time on an H200 (profile of 2026-11-24). Grouped, the attention kernel
  // reads each key/value head once for its group. But on CUDA only the flash
  // kernel, 16-bit only, takes grouped heads: an fp32 (or tf32) call falls to
  // the math kernel, which keeps each block's [batch, heads, seq, seq] weights
  // for backward (2 GiB a block for LLaMA-1.1B, out of memory on 80 GB), so
  // fp32 repeats the heads for the memory-efficient kernel.
  const bool sdpa_takes_groups =
      LLAMA_SDPA_GROUPS_HEADS && !repeat_kv_heads && !(q.is_cuda() && q.scalar_type() == torch::kFloat);
  if (n_kv_heads != n_heads && !sdpa_takes_groups) {
    // Key/value head j serves query heads [j * group, (j + 1) * group).
    const std::int64_t group = n_heads / n_kv_heads;
    k = k.repeat_interleave(group, /*dim=*/1);
    v = v.repeat_interleave(group, /*dim=*/1);
  }
  return wo(causal_attention(q, k, v).transpose(1, 2).reshape({batch, seq, n_heads * head_dim}));
}

FeedForwardImpl::FeedForwardImpl(std::int64_t dim, std::int64_t hidden, bool fused, bool fp32_weight_gradients)
    : fused(fused) {
  w1 = register_module("w1", linear(dim, hidden, fp32_weight_gradients));
  w2 = register_module("w2", linear(hidden, dim, fp32_weight_gradients));
  w3 = register_module("w3", linear(dim, hidden, fp32_weight_gradients));
  ddp::float8::share_input_cast({w1.get(), w3.get()});
}

torch::Tensor FeedForwardImpl::forward(const torch::Tensor& x) {
  // In this order, not as two arguments of one call (whose order C++ leaves
  // open): the first of a group sharing an input cast casts with its own
  // scaling, and the fused norm writes the cast with w1's.
  const torch::Tensor gate = w1(x);
  const torch::Tensor up = w3(x);
  return ops::swiglu_down(gate, up, *w2, *w1, *w3, fused);
}

TransformerBlockImpl::TransformerBlockImpl(const LlamaConfig& config)
    : fused_residual_norm(config.fused_kernels && config.fused_residual_norm) {
  attention_norm = register_module("attention_norm", RMSNorm(config.dim, config.norm_eps, config.fused_kernels));
  attention = register_module("attention", Attention(config));
  ffn_norm = register_module("ffn_norm", RMSNorm(config.dim, config.norm_eps, config.fused_kernels));
  feed_forward = register_module(
      "feed_forward", FeedForward(config.dim, config.ffn_hidden, config.fused_kernels, config.fp32_weight_gradients));
}

torch::Tensor TransformerBlockImpl::forward(const torch::Tensor& x, const Rotation& rotation) {
  const auto [h, delta] = forward_deferred(x, torch::Tensor(), nullptr, rotation);
  return h + delta;
}

std::pair<torch::Tensor, torch::Tensor> TransformerBlockImpl::forward_deferred(const torch::Tensor& x,
                                                                               const torch::Tensor& pending,
                                                                               ddp::Float8LinearImpl* pending_writer,
                                                                               const Rotation& rotation) {
  // In FP8 each norm writes the input cast of what reads it: the attention's
  // one projection (LlamaConfig::fused_qkv), and SwiGLU's gate and up, which
  // share one cast (float8::share_input_cast).
  ddp::Float8LinearImpl* const qkv = attention->wqkv ? attention->wqkv.get() : nullptr;
  const auto [stream, normed] =
      pending.defined() ? add_and_norm(x, pending, pending_writer, *attention_norm, fused_residual_norm, qkv)
                        : std::pair{x, attention_norm->forward_into(x, qkv)};
  // The residual stream stays in x's dtype (fp32 under autocast); the norms
  // return the dtype the linear layers compute in. Both norms' backward
  // writes the output gradient of the layer before (wo, the previous w2).
  const auto [h, ffn_input] = add_and_norm(stream, attention(normed, rotation), attention->wo.get(), *ffn_norm,
                                           fused_residual_norm, feed_forward->w1.get());
  return {h, feed_forward(ffn_input)};
}

LlamaImpl::LlamaImpl(const LlamaConfig& config)
    : config(checked(config)),
      rotary_(config.head_dim(), config.max_seq_len, config.rope_theta) {
  tok_embeddings = register_module("tok_embeddings", torch::nn::Embedding(config.vocab_size, config.dim));
  layers = register_module("layers", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < config.n_layers; ++i) layers->push_back(TransformerBlock(config));
  norm = register_module("norm", RMSNorm(config.dim, config.norm_eps, config.fused_kernels));
  // A tied head is the embedding's weight itself, not a second module holding
  // it: LibTorch's parameters() does not deduplicate, so a shared tensor
  // registered twice would be counted, and optimized, twice.
  if (!config.tie_embeddings) {
    output = register_module("output", linear(config.dim, config.vocab_size, config.fp32_weight_gradients));
  }

  torch::NoGradGuard no_grad;
  for (const auto& module : modules(/*include_self=*/false)) {
    if (auto* layer = module->as<ddp::Float8Linear>()) torch::nn::init::normal_(layer->weight, 0.0, kInitStd);
  }
  torch::nn::init::normal_(tok_embeddings->weight, 0.0, kInitStd);
  // Every block adds its two projections to the residual stream; scaling them
  // keeps the stream's variance from growing with depth (GPT-2).
  const double residual_std = kInitStd / std::sqrt(2.0 * static_cast<double>(config.n_layers));
  for (std::size_t i = 0; i < layers->size(); ++i) {
    const auto block = layers->ptr<TransformerBlockImpl>(i);
    torch::nn::init::normal_(block->attention->wo->weight, 0.0, residual_std);
    torch::nn::init::normal_(block->feed_forward->w2->weight, 0.0, residual_std);
  }
}

torch::Tensor LlamaImpl::forward(const torch::Tensor& tokens) {
  TORCH_CHECK(tokens.dim() == 2, "Llama expects tokens [batch, seq], got ", tokens.sizes());
  const Rotation rotation = rotary_.rotation(tokens.size(1), tokens.device(), config.fused_kernels);
  torch::Tensor h = tok_embeddings(tokens);
  // The last addend of the previous block, added in the next norm's kernel;
  // a checkpointed block takes and returns whole tensors instead.
  torch::Tensor pending;
  ddp::Float8LinearImpl* pending_writer = nullptr;  // the layer whose output pending is
  for (std::size_t i = 0; i < layers->size(); ++i) {
    const auto block = layers->ptr<TransformerBlockImpl>(i);
    // A unit of Sharding::kFull (shard_units "layers.*"): gathered only while it runs.
    if (config.activation_checkpointing) {
      h = ddp::in_unit(*block, [&] { return checkpointed(block, h, rotation); });
    } else {
      std::tie(h, pending) =
          ddp::in_unit(*block, [&] { return block->forward_deferred(h, pending, pending_writer, rotation); });
      pending_writer = block->feed_forward->w2.get();
    }
  }
  if (pending.defined()) {
    h = add_and_norm(h, pending, pending_writer, *norm, config.fused_kernels && config.fused_residual_norm, nullptr)
            .second;
  } else {
    h = norm(h);
  }
  return config.tie_embeddings ? torch::nn::functional::linear(h, tok_embeddings->weight) : output(h);
}

}  // namespace llama
