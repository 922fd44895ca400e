#pragma once

// A LLaMA-architecture decoder: RMSNorm, rotary position embeddings,
// grouped-query causal attention and a SwiGLU feed-forward in pre-norm
// residual blocks. Parameter names are those of Meta's reference
// implementation (tok_embeddings, layers.N.attention.wq, ..., norm, output),
// except that by default (LlamaConfig::fused_qkv) wq, wk and wv are one layer,
// layers.N.attention.wqkv, whose weight is theirs stacked.
//
// Every linear layer is a ddp::Float8Linear with FP8 off: it computes exactly
// what torch::nn::Linear does until ddp::float8::enable_float8() switches it on.

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>

#include <torch/torch.h>

#include <ddp/float8.h>

namespace llama {

struct LlamaConfig {
  std::int64_t vocab_size = 0;
  std::int64_t dim = 0;
  std::int64_t n_layers = 0;
  std::int64_t n_heads = 0;
  /// Key/value heads; fewer than n_heads (and dividing it) is grouped-query attention.
  std::int64_t n_kv_heads = 0;
  /// Hidden size of the SwiGLU feed-forward.
  std::int64_t ffn_hidden = 0;
  /// Longest sequence the rotary tables cover.
  std::int64_t max_seq_len = 0;
  double rope_theta = 10000;
  double norm_eps = 1e-5;
  /// The output head reuses the token embedding's weight (and has no `output` module).
  bool tie_embeddings = false;
  /// Recompute each block's activations in backward instead of keeping them.
  bool activation_checkpointing = false;
  /// RMSNorm (libddp's ddp::rms_norm), the rotary embedding and SwiGLU
  /// (fused_ops.h) as fused kernels on CUDA tensors where the build has them;
  /// false runs the ATen ops of PyTorch's reference model.
  bool fused_kernels = true;
  /// Grouped-query attention by repeating each key/value head for its query
  /// heads (repeat_interleave, as Meta's reference and PyTorch's benchmark
  /// model do) instead of handing SDPA the grouped heads (enable_gqa, LibTorch
  /// 2.5 and newer; older ones always repeat, and so does fp32 on CUDA, where
  /// only SDPA's math kernel would take grouped heads).
  bool repeat_kv_heads = false;
  /// With fused_kernels, each residual add runs in the kernel of the RMSNorm
  /// that reads its sum (ddp::add_rms_norm; without activation checkpointing
  /// also the add that ends a block, in the next block's first norm); false
  /// keeps the adds separate (the A/B of that alone).
  bool fused_residual_norm = true;
  /// The linear layers' weight gradients leave their GEMMs in fp32 under
  /// CUDA autocast (ddp::Float8Options::fp32_weight_gradients); false rounds
  /// them to the autocast dtype first, as torch::nn::Linear does.
  bool fp32_weight_gradients = true;
  /// The attention's q, k and v projections as one layer (wqkv): one GEMM
  /// instead of three forward and in each backward pass, no sum of three
  /// input gradients, and one FP8 cast of the output gradient; the split
  /// and the rotary embedding of q and k run in one kernel each way
  /// (ops::split_rotate_qkv). false: Meta's three layers wq, wk, wv.
  bool fused_qkv = true;

  /// "tiny" (byte-level, for CPU tests), "tinyllama-1.1b" or "llama2-7b".
  /// std::invalid_argument listing the valid names otherwise.
  static LlamaConfig preset(const std::string& name);

  std::int64_t head_dim() const { return dim / n_heads; }
  /// The number of parameters of the model this configuration builds.
  std::int64_t parameter_count() const;
};

/// Root-mean-square layer norm with a learned scale: ddp::rms_norm. Computed
/// in fp32 whatever the input's dtype; the output has the input's dtype (but
/// see ddp::rms_norm under autocast).
struct RMSNormImpl : torch::nn::Module {
  RMSNormImpl(std::int64_t dim, double eps, bool fused = true);
  torch::Tensor forward(const torch::Tensor& x);
  /// forward(x) for a norm whose output only `reader` reads: where that
  /// layer runs in FP8 with delayed scaling, the norm writes its FP8 input
  /// and returns a tensor without values (ddp::float8::rms_norm). Null:
  /// forward(x).
  torch::Tensor forward_into(const torch::Tensor& x, ddp::Float8LinearImpl* reader);

  double eps;
  bool fused;
  torch::Tensor weight;
};
TORCH_MODULE(RMSNorm);

/// The rotation RoPE applies at the positions of one sequence: cos and sin of
/// the angles, [seq_len, head_dim / 2] in fp32.
struct Rotation {
  /// Rotates consecutive pairs of features of x [batch, seq, heads, head_dim],
  /// Meta's (interleaved) layout.
  torch::Tensor apply(const torch::Tensor& x) const;
  /// q, k and v of qkv [batch, seq, (heads + 2 kv_heads) * head_dim], q and
  /// k rotated (ops::split_rotate_qkv); `producer`, the layer whose output
  /// qkv is, gets its output's gradient in FP8 where it runs so.
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> split_qkv(const torch::Tensor& qkv, std::int64_t heads,
                                                                    std::int64_t kv_heads,
                                                                    ddp::Float8LinearImpl* producer = nullptr) const;

  torch::Tensor cos;
  torch::Tensor sin;
  bool fused = true;
};

/// The tables of rotary position embeddings. Not a module: they are a
/// function of the configuration, so they are kept out of the state dict
/// (checkpoints keep the parameters' keys only), out of DDP's buffer broadcast, and in fp32
/// when the model is cast to a lower precision. They follow the input to its
/// device on first use instead of with Module::to().
class RotaryEmbedding {
 public:
  RotaryEmbedding(std::int64_t head_dim, std::int64_t max_seq_len, double theta);
  /// The rotation of positions [0, seq_len) on `device`.
  Rotation rotation(std::int64_t seq_len, const c10::Device& device, bool fused = true);

 private:
  torch::Tensor cos_;
  torch::Tensor sin_;
};

/// Multi-head causal self-attention; with n_kv_heads < n_heads every key/value
/// head serves n_heads / n_kv_heads consecutive query heads (grouped-query).
struct AttentionImpl : torch::nn::Module {
  explicit AttentionImpl(const LlamaConfig& config);
  torch::Tensor forward(const torch::Tensor& x, const Rotation& rotation);

  std::int64_t n_heads, n_kv_heads, head_dim;
  bool repeat_kv_heads;  ///< LlamaConfig::repeat_kv_heads
  /// wqkv with LlamaConfig::fused_qkv, else wq, wk and wv.
  ddp::Float8Linear wqkv{nullptr}, wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};
};
TORCH_MODULE(Attention);

/// SwiGLU: w2(silu(w1 x) * w3 x).
struct FeedForwardImpl : torch::nn::Module {
  FeedForwardImpl(std::int64_t dim, std::int64_t hidden, bool fused = true, bool fp32_weight_gradients = true);
  torch::Tensor forward(const torch::Tensor& x);

  bool fused;
  ddp::Float8Linear w1{nullptr}, w2{nullptr}, w3{nullptr};
};
TORCH_MODULE(FeedForward);

/// Pre-norm residual block: h = x + attention(norm(x)), then h + feed_forward(norm(h)).
struct TransformerBlockImpl : torch::nn::Module {
  explicit TransformerBlockImpl(const LlamaConfig& config);
  torch::Tensor forward(const torch::Tensor& x, const Rotation& rotation);
  /// forward(x + pending) with the last residual add left to the caller:
  /// returns {h, feed_forward(norm(h))}, whose sum is the block's output.
  /// `pending` (undefined: none) is the previous block's last addend, so
  /// that each residual add runs in the kernel of the norm after it, and
  /// `pending_writer` the layer whose output it is (its w2; null: none).
  std::pair<torch::Tensor, torch::Tensor> forward_deferred(const torch::Tensor& x, const torch::Tensor& pending,
                                                           ddp::Float8LinearImpl* pending_writer,
                                                           const Rotation& rotation);

  bool fused_residual_norm;  ///< fused_kernels && LlamaConfig::fused_residual_norm

  RMSNorm attention_norm{nullptr}, ffn_norm{nullptr};
  Attention attention{nullptr};
  FeedForward feed_forward{nullptr};
};
TORCH_MODULE(TransformerBlock);

/// The decoder. Initialised as GPT-2 and nanoGPT do: weights of the linear
/// layers and the embedding from N(0, 0.02), the projections back into the
/// residual stream (wo, w2) from N(0, 0.02 / sqrt(2 n_layers)), norms to ones.
struct LlamaImpl : torch::nn::Module {
  /// std::invalid_argument for inconsistent dimensions.
  explicit LlamaImpl(const LlamaConfig& config);
  /// tokens [batch, seq] int64, seq <= max_seq_len -> logits [batch, seq, vocab].
  torch::Tensor forward(const torch::Tensor& tokens);

  /// Only activation_checkpointing may change after construction.
  LlamaConfig config;
  torch::nn::Embedding tok_embeddings{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  /// Null with tie_embeddings.
  ddp::Float8Linear output{nullptr};

 private:
  RotaryEmbedding rotary_;
};
TORCH_MODULE(Llama);

}  // namespace llama
