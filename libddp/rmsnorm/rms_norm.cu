// RMSNorm, and the residual add before it, forward and backward: one kernel
// each way (kernels.h says why). Forward takes a block per row; backward
// (backward_kernel.cuh) keeps a thread's columns of the weight gradient in
// registers across the rows its block walks.

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "cuda/cuda_check.h"
#include "cuda/float_conversions.cuh"
#include "cuda/packs.cuh"
#include "cuda/warp_reduce.cuh"
#include "rmsnorm/backward_kernel.cuh"
#include "rmsnorm/kernels.h"

namespace ddp::detail {
namespace {

using rms_norm_kernels::block_sum;
using rms_norm_kernels::kThreads;

// One block per row: the row (cols <= a few thousand) stays in L1 between the
// pass that sums its squares and the pass that writes it. kResidual: the row
// normalised is x + delta, which the first pass also writes to `sum` (the
// residual stream's next value) and the second reads back from there.
template <typename In, typename Out, int N, bool kResidual>
__global__ void rms_norm_forward_kernel(const In* __restrict__ x, const Out* __restrict__ delta, In* __restrict__ sum,
                                        const float* __restrict__ weight, Out* __restrict__ y, float* __restrict__ rstd,
                                        int64_t cols, float eps) {
  const int64_t row_offset = static_cast<int64_t>(blockIdx.x) * cols;
  const auto* xr = reinterpret_cast<const Pack<In, N>*>(x + row_offset);
  const auto* w = reinterpret_cast<const Pack<float, N>*>(weight);
  auto* yr = reinterpret_cast<Pack<Out, N>*>(y + row_offset);
  auto* sr = reinterpret_cast<Pack<In, N>*>(sum + row_offset);
  const int64_t packs = cols / N;
  float squares = 0;
  for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
    Pack<In, N> p = xr[i];
    if constexpr (kResidual) {
      const Pack<Out, N> d = reinterpret_cast<const Pack<Out, N>*>(delta + row_offset)[i];
#pragma unroll
      for (int k = 0; k < N; ++k) p.v[k] = from_float<In>(to_float(p.v[k]) + to_float(d.v[k]));
      sr[i] = p;
    }
#pragma unroll
    for (int k = 0; k < N; ++k) squares += to_float(p.v[k]) * to_float(p.v[k]);
  }
  const float r = rsqrtf(block_sum(squares) / static_cast<float>(cols) + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
    const Pack<In, N> p = kResidual ? sr[i] : xr[i];  // what this thread wrote above
    const Pack<float, N> wp = w[i];
    Pack<Out, N> out;
#pragma unroll
    for (int k = 0; k < N; ++k) out.v[k] = from_float<Out>(to_float(p.v[k]) * r * wp.v[k]);
    yr[i] = out;
  }
}

void check_input(const at::Tensor& t, const at::Tensor& like, const char* what, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.device() == like.device() && t.is_contiguous(), what, ": ", name,
              " must be contiguous on ", like.device(), ", got ", t.sizes(), " on ", t.device());
}

struct NormForward {
  at::Tensor y, rstd, sum;
};

// rms_norm_forward, of x + delta where delta is defined.
NormForward norm_forward(const char* what, const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                         double eps, at::ScalarType out_dtype) {
  check_input(x, x, what, "x");
  check_input(weight, x, what, "weight");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0 && weight.dim() == 1 && weight.size(0) == x.size(-1) &&
                  weight.scalar_type() == at::kFloat,
              what, ": x [..., cols > 0] and fp32 weight [cols] expected, got ", x.sizes(), " and ", weight.sizes(),
              " ", weight.scalar_type());
  const bool residual = delta.defined();
  if (residual) {
    check_input(delta, x, what, "delta");
    TORCH_CHECK(delta.sizes() == x.sizes() && delta.scalar_type() == out_dtype, what, ": delta of x's shape ",
                x.sizes(), " in the output dtype ", out_dtype, " expected, got ", delta.sizes(), " ",
                delta.scalar_type());
  }
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  TORCH_CHECK(rows <= INT32_MAX, what, ": too many rows (", rows, ")");
  NormForward out{at::empty(x.sizes(), x.options().dtype(out_dtype)), at::empty({rows}, x.options().dtype(at::kFloat)),
                  residual ? at::empty_like(x) : at::Tensor()};
  if (rows == 0) return out;
  const c10::cuda::CUDAGuard device_guard(x.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const bool vectorized = cols % 4 == 0 && aligned(x.data_ptr(), 4 * x.element_size()) &&
                          aligned(weight.data_ptr(), 16) && aligned(out.y.data_ptr(), 4 * out.y.element_size()) &&
                          (!residual || (aligned(delta.data_ptr(), 4 * delta.element_size()) &&
                                         aligned(out.sum.data_ptr(), 4 * out.sum.element_size())));
  with_cuda_types(x.scalar_type(), out_dtype, what, [&](auto* in_type, auto* out_type) {
    using In = std::remove_pointer_t<decltype(in_type)>;
    using Out = std::remove_pointer_t<decltype(out_type)>;
    const auto launch =
        residual
            ? (vectorized ? rms_norm_forward_kernel<In, Out, 4, true> : rms_norm_forward_kernel<In, Out, 1, true>)
            : (vectorized ? rms_norm_forward_kernel<In, Out, 4, false> : rms_norm_forward_kernel<In, Out, 1, false>);
    launch<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        static_cast<const In*>(x.data_ptr()), residual ? static_cast<const Out*>(delta.data_ptr()) : nullptr,
        residual ? static_cast<In*>(out.sum.data_ptr()) : nullptr, weight.data_ptr<float>(),
        static_cast<Out*>(out.y.data_ptr()), out.rstd.data_ptr<float>(), cols, static_cast<float>(eps));
    DDP_CUDA_CHECK_LAUNCH("rms_norm_forward_kernel");
  });
  return out;
}

struct NormBackward {
  at::Tensor grad_x, grad_weight, grad_delta;
};

// rms_norm_backward; with `residual`, also grad_sum (may be undefined) and grad_delta.
NormBackward norm_backward(const char* what, const at::Tensor& grad_y, const at::Tensor& grad_sum, const at::Tensor& x,
                           const at::Tensor& weight, const at::Tensor& rstd, bool residual) {
  check_input(grad_y, x, what, "grad_y");
  check_input(x, x, what, "x");
  check_input(weight, x, what, "weight");
  check_input(rstd, x, what, "rstd");
  TORCH_CHECK(grad_y.sizes() == x.sizes() && x.dim() >= 1 && x.size(-1) > 0 && weight.size(0) == x.size(-1) &&
                  rstd.numel() == x.numel() / x.size(-1) && weight.scalar_type() == at::kFloat &&
                  rstd.scalar_type() == at::kFloat,
              what, ": grad_y and x [..., cols > 0], fp32 weight [cols] and rstd [rows] expected");
  if (grad_sum.defined()) {
    check_input(grad_sum, x, what, "grad_sum");
    TORCH_CHECK(grad_sum.sizes() == x.sizes() && grad_sum.scalar_type() == x.scalar_type(), what,
                ": grad_sum of x's shape and dtype expected");
  }
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  NormBackward out{at::empty_like(x), at::Tensor(), residual ? at::empty_like(grad_y) : at::Tensor()};
  if (rows == 0) {
    out.grad_weight = at::zeros_like(weight);
    return out;
  }
  const bool delta_packs_fit = !residual || aligned(out.grad_delta.data_ptr(), 4 * out.grad_delta.element_size());
  out.grad_weight = rms_norm_kernels::launch_rms_norm_backward(
      what, grad_y, grad_sum, x, weight, rstd, out.grad_x, residual, delta_packs_fit, [&](auto* out_type) {
        using Out = std::remove_pointer_t<decltype(out_type)>;
        return rms_norm_kernels::DeltaInItsDtype<Out>{residual ? static_cast<Out*>(out.grad_delta.data_ptr())
                                                               : nullptr};
      });
  return out;
}

}  // namespace

std::pair<at::Tensor, at::Tensor> rms_norm_forward(const at::Tensor& x, const at::Tensor& weight, double eps,
                                                   at::ScalarType out_dtype) {
  NormForward out = norm_forward("ddp::detail::rms_norm_forward", x, at::Tensor(), weight, eps, out_dtype);
  return {std::move(out.y), std::move(out.rstd)};
}

std::pair<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& grad_y, const at::Tensor& x,
                                                    const at::Tensor& weight, const at::Tensor& rstd) {
  NormBackward out = norm_backward("ddp::detail::rms_norm_backward", grad_y, at::Tensor(), x, weight, rstd,
                                   /*residual=*/false);
  return {std::move(out.grad_x), std::move(out.grad_weight)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_forward(const at::Tensor& x, const at::Tensor& delta,
                                                                    const at::Tensor& weight, double eps,
                                                                    at::ScalarType out_dtype) {
  NormForward out = norm_forward("ddp::detail::add_rms_norm_forward", x, delta, weight, eps, out_dtype);
  return {std::move(out.sum), std::move(out.y), std::move(out.rstd)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_backward(const at::Tensor& grad_y,
                                                                     const at::Tensor& grad_sum, const at::Tensor& sum,
                                                                     const at::Tensor& weight, const at::Tensor& rstd) {
  NormBackward out =
      norm_backward("ddp::detail::add_rms_norm_backward", grad_y, grad_sum, sum, weight, rstd, /*residual=*/true);
  return {std::move(out.grad_x), std::move(out.grad_delta), std::move(out.grad_weight)};
}

}  // namespace ddp::detail
