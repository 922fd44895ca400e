// RMSNorm, and the residual add before it, forward and backward: one kernel
// each way (kernels.h says why). Forward takes a block per row; backward
// keeps a thread's columns of the weight gradient in registers across the
// rows its block walks.

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
#include "rmsnorm/kernels.h"

namespace ddp::detail {
namespace {

constexpr int kThreads = 256;

/// The sum of `value` over the block, returned to every thread. Every thread
/// of the block must call it; blockDim.x a multiple of 32, at most kThreads.
__device__ float block_sum(float value) {
  __shared__ float warp_sums[kThreads / 32];
  value = warp_sum(value);
  __syncthreads();  // a previous call's readers are done with warp_sums
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = value;
  __syncthreads();
  float sum = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) sum += warp_sums[w];
  return sum;
}

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

// One pack of a row's first backward pass: its share of
// dot = sum(g * w * xhat) and of the weight gradient.
template <typename In, typename Out, int N>
__device__ __forceinline__ void accumulate_pack(const Pack<In, N>& xp, const Pack<Out, N>& gp, const Pack<float, N>& wp,
                                                float r, float& dot, Pack<float, N>& weight_grad) {
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const float xhat = to_float(xp.v[k]) * r;
    const float g = to_float(gp.v[k]);
    dot += g * wp.v[k] * xhat;
    weight_grad.v[k] += g * xhat;
  }
}

// One pack of the second pass: writes grad_x (plus grad_sum's pack) and,
// kResidual, the same values as grad_delta.
template <typename In, typename Out, int N, bool kResidual>
__device__ __forceinline__ void write_gradient_pack(const Pack<In, N>& xp, const Pack<Out, N>& gp,
                                                    const Pack<float, N>& wp, float r, float mean_dot,
                                                    const In* grad_sum, In* grad_x, Out* grad_delta, int64_t i) {
  Pack<float, N> grad;
#pragma unroll
  for (int k = 0; k < N; ++k) grad.v[k] = r * (to_float(gp.v[k]) * wp.v[k] - to_float(xp.v[k]) * r * mean_dot);
  if (kResidual && grad_sum != nullptr) {
    const Pack<In, N> gs = reinterpret_cast<const Pack<In, N>*>(grad_sum)[i];
#pragma unroll
    for (int k = 0; k < N; ++k) grad.v[k] += to_float(gs.v[k]);
  }
  Pack<In, N> out;
#pragma unroll
  for (int k = 0; k < N; ++k) out.v[k] = from_float<In>(grad.v[k]);
  reinterpret_cast<Pack<In, N>*>(grad_x)[i] = out;
  if constexpr (kResidual) {
    Pack<Out, N> out_delta;
#pragma unroll
    for (int k = 0; k < N; ++k) out_delta.v[k] = from_float<Out>(to_float(out.v[k]));
    reinterpret_cast<Pack<Out, N>*>(grad_delta)[i] = out_delta;
  }
}

// A block takes rows blockIdx.x, blockIdx.x + gridDim.x, ...: each thread
// owns the same columns of every row, so it accumulates the weight gradient
// of its columns without atomics, and one ATen sum over the blocks'
// `weight_partials` finishes it.
//   grad_x = rstd * (g * w - xhat * mean(g * w * xhat)),  xhat = x * rstd
//   grad_w = sum over rows of g * xhat
// A thread keeps its first P packs of the row (x, g) in registers between
// the two passes, and their weights and weight-gradient sums across the
// rows, so that each element crosses memory once; packs past P * blockDim.x
// (rows longer than the dispatch planned for) are read again and their sums
// kept in weight_partials.
// kResidual: x was the sum of the residual stream and a delta; grad_x adds
// the gradient `grad_sum` the sum got from its other reader (null: none),
// and is written once more in the delta's dtype, as its gradient.
template <typename In, typename Out, int N, int P, bool kResidual>
__global__ void rms_norm_backward_kernel(const Out* __restrict__ grad_y, const In* __restrict__ grad_sum,
                                         const In* __restrict__ x, const float* __restrict__ weight,
                                         const float* __restrict__ rstd, In* __restrict__ grad_x,
                                         Out* __restrict__ grad_delta, float* __restrict__ weight_partials,
                                         int64_t rows, int64_t cols) {
  const int64_t packs = cols / N;
  const int64_t cached_packs = static_cast<int64_t>(P) * blockDim.x;
  const auto* w = reinterpret_cast<const Pack<float, N>*>(weight);
  auto* partial = reinterpret_cast<Pack<float, N>*>(weight_partials + static_cast<int64_t>(blockIdx.x) * cols);
  Pack<float, N> cached_weight[P], cached_grad[P];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(p) * blockDim.x;
    cached_grad[p] = Pack<float, N>{};
    if (i < packs) cached_weight[p] = w[i];
  }
  for (int64_t i = cached_packs + threadIdx.x; i < packs; i += blockDim.x) partial[i] = Pack<float, N>{};
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float r = rstd[row];
    const auto* xr = reinterpret_cast<const Pack<In, N>*>(x + row * cols);
    const auto* gr = reinterpret_cast<const Pack<Out, N>*>(grad_y + row * cols);
    const In* grad_sum_row = kResidual && grad_sum != nullptr ? grad_sum + row * cols : nullptr;
    Out* grad_delta_row = kResidual ? grad_delta + row * cols : nullptr;
    Pack<In, N> cached_x[P];
    Pack<Out, N> cached_g[P];
    float dot = 0;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(p) * blockDim.x;
      if (i < packs) {
        cached_x[p] = xr[i];
        cached_g[p] = gr[i];
        accumulate_pack(cached_x[p], cached_g[p], cached_weight[p], r, dot, cached_grad[p]);
      }
    }
    for (int64_t i = cached_packs + threadIdx.x; i < packs; i += blockDim.x) {
      Pack<float, N> sum = partial[i];
      accumulate_pack(xr[i], gr[i], w[i], r, dot, sum);
      partial[i] = sum;
    }
    const float mean_dot = block_sum(dot) / static_cast<float>(cols);
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(p) * blockDim.x;
      if (i < packs) {
        write_gradient_pack<In, Out, N, kResidual>(cached_x[p], cached_g[p], cached_weight[p], r, mean_dot,
                                                   grad_sum_row, grad_x + row * cols, grad_delta_row, i);
      }
    }
    for (int64_t i = cached_packs + threadIdx.x; i < packs; i += blockDim.x) {
      write_gradient_pack<In, Out, N, kResidual>(xr[i], gr[i], w[i], r, mean_dot, grad_sum_row, grad_x + row * cols,
                                                 grad_delta_row, i);
    }
  }
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(p) * blockDim.x;
    if (i < packs) partial[i] = cached_grad[p];
  }
}

void check_input(const at::Tensor& t, const at::Tensor& like, const char* what, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.device() == like.device() && t.is_contiguous(), what, ": ", name,
              " must be contiguous on ", like.device(), ", got ", t.sizes(), " on ", t.device());
}

/// Blocks of kThreads that fill the current GPU once (2048 threads per SM).
int64_t resident_blocks() { return at::cuda::getCurrentDeviceProperties()->multiProcessorCount * (2048 / kThreads); }

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
  const c10::cuda::CUDAGuard device_guard(x.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const unsigned blocks = static_cast<unsigned>(std::min(rows, resident_blocks()));
  at::Tensor weight_partials = at::empty({blocks, cols}, weight.options());
  const auto fits_packs = [](const at::Tensor& t) {
    return !t.defined() || aligned(t.data_ptr(), 4 * t.element_size());
  };
  const bool vectorized = cols % 4 == 0 && fits_packs(x) && fits_packs(grad_y) && fits_packs(out.grad_x) &&
                          fits_packs(grad_sum) && fits_packs(out.grad_delta) && aligned(weight.data_ptr(), 16) &&
                          aligned(weight_partials.data_ptr(), 16);
  with_cuda_types(x.scalar_type(), grad_y.scalar_type(), what, [&](auto* in_type, auto* out_type) {
    using In = std::remove_pointer_t<decltype(in_type)>;
    using Out = std::remove_pointer_t<decltype(out_type)>;
    // Packs a thread keeps in registers: a whole row up to 4 packs per
    // thread (4096 columns of 4-wide packs), the rest read twice.
    const int64_t packs_per_thread = ((vectorized ? cols / 4 : cols) + kThreads - 1) / kThreads;
    const auto kernel = [&](auto pack, auto cached, auto with_residual) {
      return rms_norm_backward_kernel<In, Out, decltype(pack)::value, decltype(cached)::value,
                                      decltype(with_residual)::value>;
    };
    const auto with_packs = [&](auto pack, auto with_residual) {
      using I = std::integral_constant<int, 1>;
      using II = std::integral_constant<int, 2>;
      using IV = std::integral_constant<int, 4>;
      return packs_per_thread <= 1   ? kernel(pack, I{}, with_residual)
             : packs_per_thread <= 2 ? kernel(pack, II{}, with_residual)
                                     : kernel(pack, IV{}, with_residual);
    };
    const auto with_width = [&](auto with_residual) {
      return vectorized ? with_packs(std::integral_constant<int, 4>{}, with_residual)
                        : with_packs(std::integral_constant<int, 1>{}, with_residual);
    };
    const auto launch = residual ? with_width(std::true_type{}) : with_width(std::false_type{});
    launch<<<blocks, kThreads, 0, stream>>>(static_cast<const Out*>(grad_y.data_ptr()),
                                            grad_sum.defined() ? static_cast<const In*>(grad_sum.data_ptr()) : nullptr,
                                            static_cast<const In*>(x.data_ptr()), weight.data_ptr<float>(),
                                            rstd.data_ptr<float>(), static_cast<In*>(out.grad_x.data_ptr()),
                                            residual ? static_cast<Out*>(out.grad_delta.data_ptr()) : nullptr,
                                            weight_partials.data_ptr<float>(), rows, cols);
    DDP_CUDA_CHECK_LAUNCH("rms_norm_backward_kernel");
  });
  out.grad_weight = weight_partials.sum(0);
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
