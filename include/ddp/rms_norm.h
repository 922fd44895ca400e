#pragma once

#include <utility>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <ddp/export.h>

namespace ddp {

/// How rms_norm and add_rms_norm compute.
struct DDP_API RMSNormOptions {
  /// Added to the mean of the squares.
  TORCH_ARG(double, eps) = 1e-5;
  /// libddp's CUDA kernels where they apply (default), else ATen's ops; false: always ATen's ops
  /// (the op-for-op reference: x.float() * rsqrt(mean(x^2) + eps) * weight, back to x's dtype).
  TORCH_ARG(bool, fused) = true;
};

/// Root-mean-square layer norm with a learned scale, LLaMA's:
/// x * rsqrt(mean(x^2 over the last dim) + eps) * weight, computed in fp32
/// and returned in x's dtype. x [..., cols], weight [cols].
///
/// Fused (options.fused, a CUDA x of fp32, bf16 or fp16, cols > 0, weight
/// [cols] on x's device, and libddp built with its kernels): one kernel
/// forward and one backward, each reading its inputs once and writing its
/// outputs once, where ATen's ops take about 8 elementwise passes forward and
/// 15 backward over an fp32 copy of the activations. The values are ATen's
/// but for the one rounding and the order of the sums. Under CUDA autocast
/// the fused path returns an fp32 x's result in the autocast dtype: the norm
/// feeds linear layers, which autocast would round it to anyway, so the
/// values are the same and a full-size fp32 tensor and its cast are saved.
/// Anything else runs ATen's ops. Differentiable in x and weight (the
/// weight's gradient in its dtype); the fused backward is not differentiable
/// again: gradients of gradients (create_graph) through it are an error that
/// says to use fused(false).
DDP_API at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, const RMSNormOptions& options = {});

/// {h, rms_norm(h, weight, options)} with h = x + delta: a pre-norm block's
/// residual add and the norm of the next sub-layer's input. Fused (where
/// rms_norm is, and delta has x's shape, device and the dtype the norm
/// returns, e.g. an fp32 residual stream and a bf16 delta from autocast's
/// linear layers): one kernel forward and one backward, instead of the add,
/// the norm, and in backward the norm's gradient, its sum with h's other
/// gradient and that sum's cast to delta's dtype. h keeps x's dtype. Else
/// the add, then rms_norm.
DDP_API std::pair<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& delta,
                                                       const at::Tensor& weight, const RMSNormOptions& options = {});

/// Whether this libddp was built with the fused RMSNorm kernels (LibTorch >=
/// 2.1 with CUDA). Without them every call runs ATen's ops.
DDP_API bool rms_norm_kernels_built();

}  // namespace ddp
