#pragma once

// The LLaMA decoder's rotary embedding, SwiGLU and cross entropy, two ways:
// ATen ops (any device; op for op what PyTorch's reference in
// benchmarks/scaling/pytorch_ddp.py runs), and, with `fused` on CUDA tensors
// where fused_kernels.cu was compiled, one kernel forward and one backward
// each (fused_kernels.h says why). Both compute in fp32 and round once; they
// differ only by that rounding and the order of the sums. The fused backward
// passes are not themselves differentiable: asking for gradients of
// gradients (create_graph) through them is an error. The decoder's RMSNorm
// (with the residual add before it) is libddp's ddp::rms_norm and
// ddp::add_rms_norm (<ddp/rms_norm.h>), fused and unfused alike.

#include <cstdint>
#include <tuple>

#include <torch/types.h>

#include <ddp/float8.h>

namespace llama::ops {

/// Whether this build has the fused kernels (LibTorch >= 2.1 with CUDA).
bool fused_kernels_built();

/// Mean cross entropy of int64 targets [rows] under logits [rows, vocab],
/// computed in fp32 whatever the logits' dtype; targets of -100 are left out
/// of the mean (torch::nn::functional::cross_entropy's ignore_index). Fused:
/// one kernel forward, keeping one log-sum-exp per row, and one backward
/// writing the logits' gradient in their dtype, instead of an fp32 copy of
/// the logits, its log-softmax and their gradients.
torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets, bool fused);

/// Rotates consecutive feature pairs of x [batch, seq, heads, head_dim]
/// (Meta's interleaved layout) by the angles of their position:
/// (e, o) -> (e cos - o sin, e sin + o cos); cos and sin [seq, head_dim / 2] fp32.
torch::Tensor rotate_pairs(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, bool fused);

/// q, k and v of attention from qkv [batch, seq, (heads + 2 kv_heads) *
/// head_dim], the output of one projection (a token's q, k and v side by
/// side): q [batch, seq, heads, head_dim] and k, v [batch, seq, kv_heads,
/// head_dim], q and k rotated as rotate_pairs does. Fused: one kernel
/// forward, and one backward that writes qkv's gradient whole, where the
/// ATen ops' backward fills a zero tensor per slice and sums them; as the
/// FP8 gradient of `producer`'s output where that layer (the one whose
/// output qkv is, unchanged) runs FP8 with delayed scaling
/// (ddp::float8::output_gradient_destination).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> split_rotate_qkv(const torch::Tensor& qkv,
                                                                         const torch::Tensor& cos,
                                                                         const torch::Tensor& sin, std::int64_t heads,
                                                                         std::int64_t kv_heads, bool fused,
                                                                         ddp::Float8LinearImpl* producer = nullptr);

/// silu(gate) * up.
torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up, bool fused);

/// down(swiglu(gate, up)), where gate and up are what gate_layer and
/// up_layer returned. With `fused`, libddp's ddp::float8::swiglu_linear:
/// where the three layers run in FP8 with delayed scaling, SwiGLU writes
/// down's FP8 input itself, and its backward the FP8 gradients of
/// gate_layer's and up_layer's outputs, so that none of the three exists in
/// bf16 (gate and up must then go straight from those layers to here);
/// elsewhere the fused SwiGLU above.
torch::Tensor swiglu_down(const torch::Tensor& gate, const torch::Tensor& up, ddp::Float8LinearImpl& down,
                          ddp::Float8LinearImpl& gate_layer, ddp::Float8LinearImpl& up_layer, bool fused);

}  // namespace llama::ops
