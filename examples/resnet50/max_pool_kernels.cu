#include "max_pool_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "cuda_values.cuh"

namespace resnet::kernels {
namespace {

using examples::cuda::from_float;
using examples::cuda::Pack;
using examples::cuda::to_float;
using examples::cuda::with_pack;

constexpr int kThreads = 256;

/// The sizes both kernels index with.
struct PoolShape {
  int64_t batch, channels;
  int height, width, out_height, out_width;
  int kernel, stride, padding;
};

/// Thread i's place: batch n, row, column, and its first channel c (N per
/// thread), rows and columns of the output (forward), the input (backward) or
/// its 2x2 tiles (the tiled backward).
/// 32-bit: 64-bit divisions are many instructions each (max_pool2d_fused
/// leaves larger inputs to ATen).
struct Place {
  uint32_t n, c;
  int row, col;
};

template <int N>
__device__ Place place(uint32_t i, uint32_t channels, int rows, int cols) {
  const uint32_t packs = channels / N;
  Place p;
  p.c = i % packs * N;
  i /= packs;
  p.col = static_cast<int>(i % static_cast<uint32_t>(cols));
  i /= static_cast<uint32_t>(cols);
  p.row = static_cast<int>(i % static_cast<uint32_t>(rows));
  p.n = i / static_cast<uint32_t>(rows);
  return p;
}

// One thread per N channels of an output pixel: the window's rows, then its
// columns, in ATen's order; a value replaces the maximum if greater, or NaN.
// kKernel: the window's side where the launch fixed it (ResNet's 3, so the
// loops unroll and the loads issue together), else 0.
template <typename T, int N, int kKernel>
__global__ void __launch_bounds__(kThreads)
    max_pool_forward_kernel(const T* __restrict__ x, T* __restrict__ y, uint8_t* __restrict__ offsets,
                            const PoolShape s, uint32_t threads) {
  for (uint32_t i = blockIdx.x * kThreads + threadIdx.x; i < threads; i += gridDim.x * kThreads) {
    const Place out = place<N>(i, static_cast<uint32_t>(s.channels), s.out_height, s.out_width);
    float best[N];
    Pack<uint8_t, N> best_at;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      best[k] = -INFINITY;
      best_at.v[k] = 0;
    }
    const int kernel = kKernel > 0 ? kKernel : s.kernel;
    const int top = out.row * s.stride - s.padding, left = out.col * s.stride - s.padding;
#pragma unroll
    for (int kh = 0; kh < kernel; ++kh) {
      const int row = top + kh;
      if (row < 0 || row >= s.height) continue;
#pragma unroll
      for (int kw = 0; kw < kernel; ++kw) {
        const int col = left + kw;
        if (col < 0 || col >= s.width) continue;
        const Pack<T, N> v = *reinterpret_cast<const Pack<T, N>*>(
            x + ((int64_t{out.n} * s.height + row) * s.width + col) * s.channels + out.c);
        const auto at = static_cast<uint8_t>(kh * kernel + kw);
#pragma unroll
        for (int k = 0; k < N; ++k) {
          const float f = to_float(v.v[k]);
          if (f > best[k] || isnan(f)) {
            best[k] = f;
            best_at.v[k] = at;
          }
        }
      }
    }
    Pack<T, N> result;
#pragma unroll
    for (int k = 0; k < N; ++k) result.v[k] = from_float<T>(best[k]);  // exact: best is one of x's values
    const int64_t o = ((int64_t{out.n} * s.out_height + out.row) * s.out_width + out.col) * s.channels + out.c;
    *reinterpret_cast<Pack<T, N>*>(y + o) = result;
    *reinterpret_cast<Pack<uint8_t, N>*>(offsets + o) = best_at;
  }
}

// One thread per N channels of an input pixel: it gathers from the (at most
// ceil(kernel / stride)^2) windows that contain it, in ATen's order, so the
// fp32 sums round as ATen's do. A pixel in one window only takes its
// gradient as is (ATen's shortcut, which keeps a -0).
template <typename T, int N>
__global__ void __launch_bounds__(kThreads)
    max_pool_backward_kernel(const T* __restrict__ grad_y, const uint8_t* __restrict__ offsets, T* __restrict__ grad_x,
                             const PoolShape s, uint32_t threads) {
  for (uint32_t i = blockIdx.x * kThreads + threadIdx.x; i < threads; i += gridDim.x * kThreads) {
    const Place in = place<N>(i, static_cast<uint32_t>(s.channels), s.height, s.width);
    // The windows [first, last) along each axis whose span holds this row or column.
    const int padded_row = in.row + s.padding, padded_col = in.col + s.padding;
    const int first_row = padded_row < s.kernel ? 0 : (padded_row - s.kernel) / s.stride + 1;
    const int last_row = min(padded_row / s.stride + 1, s.out_height);
    const int first_col = padded_col < s.kernel ? 0 : (padded_col - s.kernel) / s.stride + 1;
    const int last_col = min(padded_col / s.stride + 1, s.out_width);
    const bool one_window = last_row - first_row == 1 && last_col - first_col == 1;
    float sum[N];
    Pack<T, N> single;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      sum[k] = 0;
      single.v[k] = from_float<T>(0);
    }
    for (int row = first_row; row < last_row; ++row) {
      for (int col = first_col; col < last_col; ++col) {
        const int64_t o = ((int64_t{in.n} * s.out_height + row) * s.out_width + col) * s.channels + in.c;
        const Pack<uint8_t, N> at = *reinterpret_cast<const Pack<uint8_t, N>*>(offsets + o);
        const Pack<T, N> g = *reinterpret_cast<const Pack<T, N>*>(grad_y + o);
        const auto here = static_cast<uint8_t>((padded_row - row * s.stride) * s.kernel + padded_col - col * s.stride);
#pragma unroll
        for (int k = 0; k < N; ++k) {
          if (at.v[k] != here) continue;
          sum[k] += to_float(g.v[k]);
          single.v[k] = g.v[k];
        }
      }
    }
    Pack<T, N> result;
#pragma unroll
    for (int k = 0; k < N; ++k) result.v[k] = one_window ? single.v[k] : from_float<T>(sum[k]);
    *reinterpret_cast<Pack<T, N>*>(grad_x + ((int64_t{in.n} * s.height + in.row) * s.width + in.col) * s.channels +
                                   in.c) = result;
  }
}

// ResNet's window (3x3, stride 2, padding 1): input row 2m lies in window
// row m only, row 2m + 1 in rows m and m + 1, and columns alike. One thread
// per N channels of a 2x2 tile of input pixels (rows 2m, 2m + 1, columns 2p,
// 2p + 1) loads the four windows (m, m + 1) x (p, p + 1) once for the four
// pixels, where a thread per pixel loads each window nine times over. Each
// pixel's sum is the gather's above, in its order.
template <typename T, int N>
__global__ void __launch_bounds__(kThreads)
    max_pool_backward_tile_kernel(const T* __restrict__ grad_y, const uint8_t* __restrict__ offsets,
                                  T* __restrict__ grad_x, const PoolShape s, uint32_t threads) {
  for (uint32_t i = blockIdx.x * kThreads + threadIdx.x; i < threads; i += gridDim.x * kThreads) {
    const Place tile = place<N>(i, static_cast<uint32_t>(s.channels), (s.height + 1) / 2, (s.width + 1) / 2);
    Pack<T, N> g[2][2];
    Pack<uint8_t, N> at[2][2];
    bool present[2][2];  // windows past the output's last row or column hold no pixel of the tile
#pragma unroll
    for (int dr = 0; dr < 2; ++dr) {
#pragma unroll
      for (int dc = 0; dc < 2; ++dc) {
        const int row = tile.row + dr, col = tile.col + dc;
        present[dr][dc] = row < s.out_height && col < s.out_width;
        if (!present[dr][dc]) continue;
        const int64_t o = ((int64_t{tile.n} * s.out_height + row) * s.out_width + col) * s.channels + tile.c;
        g[dr][dc] = *reinterpret_cast<const Pack<T, N>*>(grad_y + o);
        at[dr][dc] = *reinterpret_cast<const Pack<uint8_t, N>*>(offsets + o);
      }
    }
#pragma unroll
    for (int pr = 0; pr < 2; ++pr) {
      const int row = 2 * tile.row + pr;
      if (row >= s.height) continue;
#pragma unroll
      for (int pc = 0; pc < 2; ++pc) {
        const int col = 2 * tile.col + pc;
        if (col >= s.width) continue;
        float sum[N];
        Pack<T, N> single;
#pragma unroll
        for (int k = 0; k < N; ++k) {
          sum[k] = 0;
          single.v[k] = from_float<T>(0);
        }
        int windows = 0;
        // Pixel (row, col) lies in window rows tile.row .. tile.row + pr and columns alike.
#pragma unroll
        for (int dr = 0; dr <= pr; ++dr) {
#pragma unroll
          for (int dc = 0; dc <= pc; ++dc) {
            if (!present[dr][dc]) continue;
            ++windows;
            const auto here = static_cast<uint8_t>((row + 1 - 2 * (tile.row + dr)) * 3 + col + 1 - 2 * (tile.col + dc));
#pragma unroll
            for (int k = 0; k < N; ++k) {
              if (at[dr][dc].v[k] != here) continue;
              sum[k] += to_float(g[dr][dc].v[k]);
              single.v[k] = g[dr][dc].v[k];
            }
          }
        }
        Pack<T, N> result;
#pragma unroll
        for (int k = 0; k < N; ++k) result.v[k] = windows == 1 ? single.v[k] : from_float<T>(sum[k]);
        *reinterpret_cast<Pack<T, N>*>(grad_x + ((int64_t{tile.n} * s.height + row) * s.width + col) * s.channels +
                                       tile.c) = result;
      }
    }
  }
}

/// Blocks for `threads` threads, at most enough to fill the GPU 8 times over
/// (the kernels loop over the rest): one thread per pack and no loop made
/// backward slower (0.258 against 0.244 ms, ResNet's stem at batch 128 on an
/// H200, 2026-11-28).
int blocks_for(int64_t threads) {
  const int64_t limit = int64_t{at::cuda::getCurrentDeviceProperties()->multiProcessorCount} * (2048 / kThreads) * 8;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((threads + kThreads - 1) / kThreads, limit)));
}

/// `elements` / `pack` threads (elements: the places the kernel takes, N
/// channels each), a 32-bit number with room for the loop's step past the
/// last, as the kernels count them; x and y must both fit.
uint32_t thread_count(const at::Tensor& x, const at::Tensor& y, int64_t elements, int pack, const char* what) {
  TORCH_CHECK(x.numel() <= kMaxElements && y.numel() <= kMaxElements, what, ": input ", x.sizes(), " or output ",
              y.sizes(), " has more than the kernels' ", kMaxElements, " elements; use torch::max_pool2d");
  return static_cast<uint32_t>(elements / pack);
}

/// ResNet's 3x3 windows at stride 2, which the forward kernel unrolls (any padding).
bool resnets_window(const PoolWindow& window) { return window.kernel == 3 && window.stride == 2; }

/// ResNet's window with its padding of 1, which the backward takes in 2x2 tiles.
bool resnets_padded_window(const PoolWindow& window) { return resnets_window(window) && window.padding == 1; }

PoolShape shape_of(at::IntArrayRef input_sizes, const PoolWindow& window, const char* what) {
  TORCH_CHECK(input_sizes.size() == 4, what, ": a 4-D input [N, C, H, W] expected, got ", input_sizes);
  TORCH_CHECK(window.kernel >= 1 && window.kernel * window.kernel <= 256 && window.stride >= 1 && window.padding >= 0 &&
                  window.padding <= window.kernel / 2,
              what, ": kernel 1..16, stride >= 1 and padding 0..kernel/2 expected, got kernel ", window.kernel,
              ", stride ", window.stride, ", padding ", window.padding);
  PoolShape s;
  s.batch = input_sizes[0];
  s.channels = input_sizes[1];
  TORCH_CHECK(input_sizes[2] <= INT32_MAX && input_sizes[3] <= INT32_MAX, what, ": input too large, ", input_sizes);
  s.height = static_cast<int>(input_sizes[2]);
  s.width = static_cast<int>(input_sizes[3]);
  s.kernel = static_cast<int>(window.kernel);
  s.stride = static_cast<int>(window.stride);
  s.padding = static_cast<int>(window.padding);
  s.out_height = (s.height + 2 * s.padding - s.kernel) / s.stride + 1;
  s.out_width = (s.width + 2 * s.padding - s.kernel) / s.stride + 1;
  TORCH_CHECK(s.height + 2 * s.padding >= s.kernel && s.width + 2 * s.padding >= s.kernel, what, ": the window (",
              s.kernel, " with padding ", s.padding, ") is larger than the input ", input_sizes);
  return s;
}

}  // namespace

std::pair<at::Tensor, at::Tensor> max_pool_forward(const at::Tensor& x, const PoolWindow& window) {
  const char* what = "resnet::kernels::max_pool_forward";
  const PoolShape s = shape_of(x.sizes(), window, what);
  TORCH_CHECK(x.is_cuda() && x.is_contiguous(at::MemoryFormat::ChannelsLast), what,
              ": a channels_last CUDA input expected, got ", x.sizes(), " with strides ", x.strides(), " on ",
              x.device());
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty({s.batch, s.channels, s.out_height, s.out_width},
                           x.options().memory_format(at::MemoryFormat::ChannelsLast));
  at::Tensor offsets = at::empty({s.batch, s.out_height, s.out_width, s.channels}, x.options().dtype(at::kByte));
  if (y.numel() == 0) return {y, offsets};
  with_pack(x.scalar_type(), s.channels, {x.data_ptr(), y.data_ptr()}, what, [&](auto type, auto pack) {
    using T = typename decltype(type)::type;
    constexpr int N = decltype(pack)::value;
    const uint32_t threads = thread_count(x, y, y.numel(), N, what);
    const auto kernel = resnets_window(window) ? max_pool_forward_kernel<T, N, 3> : max_pool_forward_kernel<T, N, 0>;
    kernel<<<blocks_for(threads), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), offsets.data_ptr<uint8_t>(), s, threads);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {y, offsets};
}

at::Tensor max_pool_backward(const at::Tensor& grad_y, const at::Tensor& offsets, at::IntArrayRef input_sizes,
                             const PoolWindow& window) {
  const char* what = "resnet::kernels::max_pool_backward";
  const PoolShape s = shape_of(input_sizes, window, what);
  TORCH_CHECK(grad_y.is_cuda() && grad_y.is_contiguous(at::MemoryFormat::ChannelsLast) &&
                  grad_y.sizes() == at::IntArrayRef({s.batch, s.channels, s.out_height, s.out_width}),
              what, ": grad_y must be channels_last of the output's sizes [", s.batch, ", ", s.channels, ", ",
              s.out_height, ", ", s.out_width, "], got ", grad_y.sizes(), " with strides ", grad_y.strides());
  TORCH_CHECK(offsets.device() == grad_y.device() && offsets.scalar_type() == at::kByte && offsets.is_contiguous() &&
                  offsets.numel() == grad_y.numel(),
              what, ": offsets must be max_pool_forward's, got ", offsets.sizes(), " of ", offsets.scalar_type());
  const c10::cuda::CUDAGuard guard(grad_y.device());
  at::Tensor grad_x = at::empty(input_sizes, grad_y.options().memory_format(at::MemoryFormat::ChannelsLast));
  if (grad_x.numel() == 0) return grad_x;
  with_pack(grad_y.scalar_type(), s.channels, {grad_y.data_ptr(), grad_x.data_ptr()}, what, [&](auto type, auto pack) {
    using T = typename decltype(type)::type;
    constexpr int N = decltype(pack)::value;
    const bool tiles = resnets_padded_window(window);
    const int64_t places = tiles ? s.batch * ((s.height + 1) / 2) * ((s.width + 1) / 2) * s.channels : grad_x.numel();
    const uint32_t threads = thread_count(grad_x, grad_y, places, N, what);
    const auto kernel = tiles ? max_pool_backward_tile_kernel<T, N> : max_pool_backward_kernel<T, N>;
    kernel<<<blocks_for(threads), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        static_cast<const T*>(grad_y.data_ptr()), offsets.data_ptr<uint8_t>(), static_cast<T*>(grad_x.data_ptr()), s,
        threads);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return grad_x;
}

}  // namespace resnet::kernels
