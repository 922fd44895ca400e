#pragma once

// RMSNorm's backward kernel, shared by the norms that differ only in how
// they write the gradient of the residual branch's output (delta): in its
// own dtype (ddp::add_rms_norm, rms_norm.cu), or as the FP8 output gradient
// of the layer that computed delta (float8::add_rms_norm,
// float8/rms_norm.cu). A writer is a value type with begin(), write() of one
// pack and finish(), each called by every thread of the block, and
// kAlsoWithoutDelta, whether the kernel without a delta is made with it.

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda/cuda_check.h"
#include "cuda/float_conversions.cuh"
#include "cuda/packs.cuh"
#include "cuda/warp_reduce.cuh"

namespace ddp::detail::rms_norm_kernels {

constexpr int kThreads = 256;

/// The sum of `value` over the block, returned to every thread. Every thread
/// of the block must call it; blockDim.x a multiple of 32, at most kThreads.
__device__ __forceinline__ float block_sum(float value) {
  __shared__ float warp_sums[kThreads / 32];
  value = warp_sum(value);
  __syncthreads();  // a previous call's readers are done with warp_sums
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = value;
  __syncthreads();
  float sum = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) sum += warp_sums[w];
  return sum;
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

// One pack of the second pass: writes grad_x (plus grad_sum's pack `gs`,
// where there is a grad_sum) and, kResidual, hands the same values to the
// delta's writer.
template <typename In, typename Out, int N, bool kResidual, typename DeltaWriter>
__device__ __forceinline__ void write_gradient_pack(const Pack<In, N>& xp, const Pack<Out, N>& gp,
                                                    const Pack<float, N>& wp, float r, float mean_dot,
                                                    bool with_grad_sum, const Pack<In, N>& gs, In* grad_x,
                                                    DeltaWriter& delta, int64_t row_offset, int64_t i) {
  Pack<float, N> grad;
#pragma unroll
  for (int k = 0; k < N; ++k) grad.v[k] = r * (to_float(gp.v[k]) * wp.v[k] - to_float(xp.v[k]) * r * mean_dot);
  if (kResidual && with_grad_sum) {
#pragma unroll
    for (int k = 0; k < N; ++k) grad.v[k] += to_float(gs.v[k]);
  }
  Pack<In, N> out;
#pragma unroll
  for (int k = 0; k < N; ++k) out.v[k] = from_float<In>(grad.v[k]);
  reinterpret_cast<Pack<In, N>*>(grad_x)[i] = out;
  if constexpr (kResidual) delta.write(row_offset, i, out);
}

/// The delta's gradient in the delta's own dtype Out: the values of grad_x,
/// rounded once more.
template <typename Out>
struct DeltaInItsDtype {
  static constexpr bool kAlsoWithoutDelta = true;  // the plain norm's backward runs with it too
  Out* grad_delta;                                 // [rows, cols]; null without a delta

  __device__ __forceinline__ void begin() {}
  template <typename In, int N>
  __device__ __forceinline__ void write(int64_t row_offset, int64_t i, const Pack<In, N>& grad) {
    Pack<Out, N> out;
#pragma unroll
    for (int k = 0; k < N; ++k) out.v[k] = from_float<Out>(to_float(grad.v[k]));
    reinterpret_cast<Pack<Out, N>*>(grad_delta + row_offset)[i] = out;
  }
  __device__ __forceinline__ void finish() {}
};

// A block takes rows blockIdx.x, blockIdx.x + gridDim.x, ...: each thread
// owns the same columns of every row, so it accumulates the weight gradient
// of its columns without atomics, and one ATen sum over the blocks'
// `weight_partials` finishes it.
//   grad_x = rstd * (g * w - xhat * mean(g * w * xhat)),  xhat = x * rstd
//   grad_w = sum over rows of g * xhat
// A thread keeps its first P packs of the row (x, g, and grad_sum's, loaded
// with them so that the row waits for memory once, not again after the
// block's sum) in registers between the two passes, and their weights and
// weight-gradient sums across the rows, so that each element crosses memory
// once; packs past P * blockDim.x (rows longer than the dispatch planned
// for) are read again and their sums kept in weight_partials.
// kResidual: x was the sum of the residual stream and a delta; grad_x adds
// the gradient `grad_sum` the sum got from its other reader (null: none),
// and `delta_writer` writes the same values as the delta's gradient.
template <typename In, typename Out, int N, int P, bool kResidual, typename DeltaWriter>
__global__ void rms_norm_backward_kernel(const Out* __restrict__ grad_y, const In* __restrict__ grad_sum,
                                         const In* __restrict__ x, const float* __restrict__ weight,
                                         const float* __restrict__ rstd, In* __restrict__ grad_x,
                                         const DeltaWriter delta_writer, float* __restrict__ weight_partials,
                                         int64_t rows, int64_t cols) {
  DeltaWriter delta = delta_writer;
  delta.begin();
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
    const bool with_grad_sum = kResidual && grad_sum != nullptr;
    // Read only with_grad_sum; x's row stands in for a null grad_sum.
    const auto* grad_sum_row = reinterpret_cast<const Pack<In, N>*>(with_grad_sum ? grad_sum + row * cols : x);
    Pack<In, N> cached_x[P], cached_s[P];
    Pack<Out, N> cached_g[P];
    float dot = 0;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(p) * blockDim.x;
      if (i < packs) {
        cached_x[p] = xr[i];
        cached_g[p] = gr[i];
        if (with_grad_sum) cached_s[p] = grad_sum_row[i];
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
                                                   with_grad_sum, cached_s[p], grad_x + row * cols, delta, row * cols,
                                                   i);
      }
    }
    for (int64_t i = cached_packs + threadIdx.x; i < packs; i += blockDim.x) {
      write_gradient_pack<In, Out, N, kResidual>(xr[i], gr[i], w[i], r, mean_dot, with_grad_sum,
                                                 with_grad_sum ? grad_sum_row[i] : Pack<In, N>{}, grad_x + row * cols,
                                                 delta, row * cols, i);
    }
  }
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(p) * blockDim.x;
    if (i < packs) partial[i] = cached_grad[p];
  }
  delta.finish();
}

/// Blocks of kThreads of `kernel` that fill the current GPU once. Asked,
/// not assumed from 2048 threads per SM: the kernels that keep a row in
/// registers fit 3 or 4 blocks of 256 threads on an SM, not 8, and more
/// blocks than fit only run as a second wave and add rows of
/// weight_partials for the sum after the kernel.
template <typename Kernel>
int64_t resident_blocks(Kernel kernel) {
  int per_sm = 0;
  DDP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
  return static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * std::max(per_sm, 1);
}

/// Runs the kernel on x [rows, cols] (rows > 0; the caller checked shapes,
/// dtypes and devices) on the current stream, writing grad_x and, with
/// `residual`, the delta's gradient through `delta_writer_for((Out*)nullptr)`
/// for grad_y's dtype Out. delta_packs_fit: whether that writer takes packs
/// of 4. Returns the weight gradient, fp32 [cols].
template <typename DeltaWriterFor>
at::Tensor launch_rms_norm_backward(const char* what, const at::Tensor& grad_y, const at::Tensor& grad_sum,
                                    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& rstd,
                                    const at::Tensor& grad_x, bool residual, bool delta_packs_fit,
                                    DeltaWriterFor delta_writer_for) {
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  const c10::cuda::CUDAGuard device_guard(x.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const auto fits_packs = [](const at::Tensor& t) {
    return !t.defined() || aligned(t.data_ptr(), 4 * t.element_size());
  };
  // weight_partials is allocated below: a new allocation is aligned, and its
  // rows of cols % 4 == 0 floats are 16-byte multiples.
  const bool vectorized = cols % 4 == 0 && fits_packs(x) && fits_packs(grad_y) && fits_packs(grad_x) &&
                          fits_packs(grad_sum) && delta_packs_fit && aligned(weight.data_ptr(), 16);
  at::Tensor weight_partials;
  with_cuda_types(x.scalar_type(), grad_y.scalar_type(), what, [&](auto* in_type, auto* out_type) {
    using In = std::remove_pointer_t<decltype(in_type)>;
    using Out = std::remove_pointer_t<decltype(out_type)>;
    const auto delta_writer = delta_writer_for(out_type);
    using DeltaWriter = std::remove_const_t<decltype(delta_writer)>;
    // Packs a thread keeps in registers: a whole row up to 4 packs per
    // thread (4096 columns of 4-wide packs), the rest read twice.
    const int64_t packs_per_thread = ((vectorized ? cols / 4 : cols) + kThreads - 1) / kThreads;
    const auto kernel = [&](auto pack, auto cached, auto with_residual) {
      return rms_norm_backward_kernel<In, Out, decltype(pack)::value, decltype(cached)::value,
                                      decltype(with_residual)::value, DeltaWriter>;
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
    // A writer only for the delta's gradient is not instantiated without one.
    const auto launch = [&] {
      if constexpr (DeltaWriter::kAlsoWithoutDelta) {
        return residual ? with_width(std::true_type{}) : with_width(std::false_type{});
      } else {
        TORCH_CHECK(residual, what, ": this writer is for the delta's gradient");
        return with_width(std::true_type{});
      }
    }();
    const auto blocks = static_cast<unsigned>(std::min(rows, resident_blocks(launch)));
    weight_partials = at::empty({static_cast<int64_t>(blocks), cols}, weight.options());
    launch<<<blocks, kThreads, 0, stream>>>(static_cast<const Out*>(grad_y.data_ptr()),
                                            grad_sum.defined() ? static_cast<const In*>(grad_sum.data_ptr()) : nullptr,
                                            static_cast<const In*>(x.data_ptr()), weight.data_ptr<float>(),
                                            rstd.data_ptr<float>(), static_cast<In*>(grad_x.data_ptr()), delta_writer,
                                            weight_partials.data_ptr<float>(), rows, cols);
    DDP_CUDA_CHECK_LAUNCH("rms_norm_backward_kernel");
  });
  return weight_partials.sum(0);
}

}  // namespace ddp::detail::rms_norm_kernels
