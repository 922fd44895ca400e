#pragma once

// The LLaMA decoder's non-GEMM layers as fused CUDA kernels: the rotary
// embedding, SwiGLU and the cross entropy (RMSNorm's, with the residual add,
// are libddp's: ddp::rms_norm, ddp::add_rms_norm). In ATen each takes
// several elementwise kernels, each a full pass over an fp32 copy of the
// activations; with RMSNorm's, about half of a bf16 step on tinyllama-1.1b.
// Each kernel here reads its inputs once and writes its outputs once,
// computing in fp32 as the ATen ops do and rounding once at the end.
//
// Tensors: contiguous, on one CUDA device, fp32, bf16 or fp16 unless said
// otherwise; the kernels run on the device's current stream. No CUDA headers
// here: fused_ops.cpp includes it. Defined only where fused_kernels.cu is
// compiled (LLAMA_WITH_CUDA_KERNELS).

#include <cstdint>
#include <tuple>
#include <utility>

#include <ATen/core/Tensor.h>

#include <ddp/float8_tensor.h>

namespace llama::kernels {

/// Rotates consecutive feature pairs of x [batch, seq, heads, head_dim] by the
/// angles of their position: (e, o) -> (e cos - o sin, e sin + o cos), with
/// cos and sin [seq, head_dim / 2] fp32. `inverse` rotates by the negated
/// angles, which is the gradient of the rotation.
at::Tensor rotate_pairs(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool inverse);

/// q, k and v from the output of one projection, qkv [batch, seq, (heads +
/// 2 kv_heads) * head_dim] (a token's q, k and v side by side), in one pass:
/// q [batch, seq, heads, head_dim] and k [batch, seq, kv_heads, head_dim]
/// rotated as rotate_pairs does, v as is.
std::tuple<at::Tensor, at::Tensor, at::Tensor> split_rotate_qkv(const at::Tensor& qkv, const at::Tensor& cos,
                                                                const at::Tensor& sin, int64_t heads, int64_t kv_heads);

/// The gradient of split_rotate_qkv: qkv's, written whole from those of q, k
/// and v.
at::Tensor merge_rotate_qkv(const at::Tensor& grad_q, const at::Tensor& grad_k, const at::Tensor& grad_v,
                            const at::Tensor& cos, const at::Tensor& sin);

/// The same written as `cast`, the FP8 gradient of the projection's output
/// that ddp::float8::output_gradient_destination gave ([tokens, width]
/// data, its scale and the amax to max-accumulate into): the values
/// merge_rotate_qkv would write, times the scale, saturated.
void merge_rotate_qkv_to_float8(const at::Tensor& grad_q, const at::Tensor& grad_k, const at::Tensor& grad_v,
                                const at::Tensor& cos, const at::Tensor& sin, const ddp::Float8Tensor& cast);

/// silu(gate) * up, gate and up of one shape and dtype.
at::Tensor swiglu_forward(const at::Tensor& gate, const at::Tensor& up);

/// The gradients of swiglu_forward: {grad_gate, grad_up}.
std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& grad_y, const at::Tensor& gate,
                                                  const at::Tensor& up);

/// Cross entropy of each row of logits [rows, vocab] (fp32, bf16 or fp16)
/// against int64 targets [rows], in fp32, one pass over the logits:
/// {losses [rows] (0 where the target is ignore_index), log_sum_exp [rows]}.
std::pair<at::Tensor, at::Tensor> cross_entropy_forward(const at::Tensor& logits, const at::Tensor& targets,
                                                        int64_t ignore_index);

/// The logits' gradient, in their dtype: scale * (softmax(logits) -
/// onehot(targets)) per row, zero for ignored rows, scale an fp32 tensor of
/// one element on the device (the loss's gradient over the rows it averaged).
at::Tensor cross_entropy_backward(const at::Tensor& scale, const at::Tensor& logits, const at::Tensor& targets,
                                  const at::Tensor& log_sum_exp, int64_t ignore_index);

}  // namespace llama::kernels
