// BatchNorm, residual add and ReLU over channels-last activations, forward
// and backward, each direction one reduction pass and one elementwise pass.
// Rows x channels: a thread owns 4 or 8 neighbouring channels (one 8 or 16
// byte load per row) and walks rows, so its channels' statistics and
// coefficients stay in registers; the threads of a block along y take
// interleaved rows, and the blocks along y split the rows between them.
// Synchronised BatchNorm runs the same passes with its all-reduces between
// a reduction pass and the finishing kernel that follows it (kernels.h).

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <type_traits>

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "batchnorm/kernels.h"
#include "cuda/cuda_check.h"
#include "cuda/float_conversions.cuh"
#include "cuda/packs.cuh"

namespace ddp::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kFinishWays = 32;  // threads merging one channel's partial results

/// Chan's merge of two Welford accumulators (count, mean, sum of squared deviations).
__device__ __forceinline__ void merge(float& n, float& mean, float& m2, float n_b, float mean_b, float m2_b) {
  const float total = n + n_b;
  if (total == 0.f) return;
  const float delta = mean_b - mean;
  const float weight_b = n_b / total;
  mean += delta * weight_b;
  m2 += m2_b + delta * delta * n * weight_b;
  n = total;
}

/// The rows block `blockIdx.y` walks: [first, last).
struct RowRange {
  int64_t first, last;
};
__device__ __forceinline__ RowRange rows_of_block(int64_t rows, int64_t rows_per_block) {
  const int64_t first = blockIdx.y * rows_per_block;
  return {first, min(rows, first + rows_per_block)};
}

/// Per block along y and channel: count, mean and squared deviations of its
/// rows, in partial[3][gridDim.y][channels].
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    batch_norm_statistics(const T* __restrict__ x, int64_t rows, int channels, int64_t rows_per_block,
                          float* __restrict__ partial) {
  extern __shared__ float shared[];  // [blockDim.y][blockDim.x][1 + 2 V]
  const int group = blockIdx.x * blockDim.x + threadIdx.x;
  const bool owns = group * V < channels;
  const RowRange range = rows_of_block(rows, rows_per_block);
  float n = 0.f, mean[V] = {}, m2[V] = {};
  if (owns) {
    for (int64_t row = range.first + threadIdx.y; row < range.last; row += blockDim.y) {
      float v[V];
      load_as_floats(x + row * channels + group * V, v);
      n += 1.f;
      const float inverse = 1.f / n;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float delta = v[i] - mean[i];
        mean[i] += delta * inverse;
        m2[i] += delta * (v[i] - mean[i]);
      }
    }
  }
  float* mine = shared + (threadIdx.y * blockDim.x + threadIdx.x) * (1 + 2 * V);
  mine[0] = n;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    mine[1 + i] = mean[i];
    mine[1 + V + i] = m2[i];
  }
  __syncthreads();
  if (threadIdx.y != 0 || !owns) return;
  float total[V];
#pragma unroll
  for (int i = 0; i < V; ++i) total[i] = n;
  for (unsigned y = 1; y < blockDim.y; ++y) {
    const float* other = shared + (y * blockDim.x + threadIdx.x) * (1 + 2 * V);
#pragma unroll
    for (int i = 0; i < V; ++i) merge(total[i], mean[i], m2[i], other[0], other[1 + i], other[1 + V + i]);
  }
  const int64_t plane = static_cast<int64_t>(gridDim.y) * channels;
  float* out = partial + static_cast<int64_t>(blockIdx.y) * channels + group * V;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    out[i] = total[i];
    out[plane + i] = mean[i];
    out[2 * plane + i] = m2[i];
  }
}

/// In a block of 32 x kFinishWays threads, channel blockIdx.x * 32 +
/// threadIdx.x: the kFinishWays threads merge the blocks' statistics; true
/// in the thread (y = 0) that then holds the channel's, false elsewhere.
__device__ __forceinline__ bool merge_partial_statistics(const float* __restrict__ partial, int parts, int channels,
                                                         float& n, float& mean, float& m2) {
  __shared__ float merged[kFinishWays][32][3];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const int64_t plane = static_cast<int64_t>(parts) * channels;
  n = 0.f, mean = 0.f, m2 = 0.f;
  if (c < channels) {
    for (int p = threadIdx.y; p < parts; p += kFinishWays) {
      const int64_t at = static_cast<int64_t>(p) * channels + c;
      merge(n, mean, m2, partial[at], partial[plane + at], partial[2 * plane + at]);
    }
  }
  merged[threadIdx.y][threadIdx.x][0] = n;
  merged[threadIdx.y][threadIdx.x][1] = mean;
  merged[threadIdx.y][threadIdx.x][2] = m2;
  __syncthreads();
  if (threadIdx.y != 0 || c >= channels) return false;
  for (int way = 1; way < kFinishWays; ++way) {
    merge(n, mean, m2, merged[way][threadIdx.x][0], merged[way][threadIdx.x][1], merged[way][threadIdx.x][2]);
  }
  return true;
}

/// Channel c's batch statistics (biased and unbiased variance): written out,
/// folded into the running ones and, with weight and bias, into
/// scale_shift[2][channels].
struct ChannelStatistics {
  float mean, variance, unbiased_variance;
};
__device__ __forceinline__ void finish_channel(int c, int channels, ChannelStatistics stats,
                                               const float* __restrict__ weight, const float* __restrict__ bias,
                                               float* __restrict__ running_mean, float* __restrict__ running_var,
                                               float momentum, float eps, float* __restrict__ mean_out,
                                               float* __restrict__ invstd_out, float* __restrict__ scale_shift) {
  const float invstd = rsqrtf(stats.variance + eps);
  mean_out[c] = stats.mean;
  invstd_out[c] = invstd;
  if (running_mean != nullptr) {
    running_mean[c] = (1.f - momentum) * running_mean[c] + momentum * stats.mean;
    running_var[c] = (1.f - momentum) * running_var[c] + momentum * stats.unbiased_variance;
  }
  const float scale = (weight != nullptr ? weight[c] : 1.f) * invstd;
  scale_shift[c] = scale;
  scale_shift[channels + c] = (bias != nullptr ? bias[c] : 0.f) - stats.mean * scale;
}

/// A block per 32 channels: the blocks' statistics merged, then finished.
__global__ void __launch_bounds__(32 * kFinishWays)
    batch_norm_finish_statistics(const float* __restrict__ partial, int parts, int channels,
                                 const float* __restrict__ weight, const float* __restrict__ bias,
                                 float* __restrict__ running_mean, float* __restrict__ running_var, float momentum,
                                 float eps, float* __restrict__ mean_out, float* __restrict__ invstd_out,
                                 float* __restrict__ scale_shift) {
  float n, mean, m2;
  if (!merge_partial_statistics(partial, parts, channels, n, mean, m2)) return;
  const float variance = m2 / n;
  finish_channel(blockIdx.x * 32 + threadIdx.x, channels, {mean, variance, n > 1.f ? m2 / (n - 1.f) : variance}, weight,
                 bias, running_mean, running_var, momentum, eps, mean_out, invstd_out, scale_shift);
}

/// A block per 32 channels: this rank's moments for the all-reduce,
/// moments[1 + 2 channels] = {count, per channel the sum, per channel the sum
/// of squares}, in fp64 so that the squares' sum keeps the variance (it is
/// formed from the centred m2, not accumulated raw).
__global__ void __launch_bounds__(32 * kFinishWays)
    batch_norm_merge_moments(const float* __restrict__ partial, int parts, int channels, double* __restrict__ moments) {
  float n, mean, m2;
  if (!merge_partial_statistics(partial, parts, channels, n, mean, m2)) return;
  const int c = blockIdx.x * 32 + threadIdx.x;
  const double count = n, mu = mean;
  if (c == 0) moments[0] = count;
  moments[1 + c] = count * mu;
  moments[1 + channels + c] = static_cast<double>(m2) + count * mu * mu;
}

/// A thread per channel: the statistics of every rank's batch from the
/// all-reduced moments, finished as one rank's are.
__global__ void batch_norm_finish_global_statistics(const double* __restrict__ moments, int channels,
                                                    const float* __restrict__ weight, const float* __restrict__ bias,
                                                    float* __restrict__ running_mean, float* __restrict__ running_var,
                                                    float momentum, float eps, float* __restrict__ mean_out,
                                                    float* __restrict__ invstd_out, float* __restrict__ scale_shift) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  const double count = moments[0];
  const double mean = moments[1 + c] / count;
  const double variance = fmax(moments[1 + channels + c] / count - mean * mean, 0.0);
  const double unbiased = count > 1.0 ? variance * count / (count - 1.0) : variance;
  finish_channel(c, channels, {static_cast<float>(mean), static_cast<float>(variance), static_cast<float>(unbiased)},
                 weight, bias, running_mean, running_var, momentum, eps, mean_out, invstd_out, scale_shift);
}

/// y = relu?(x * scale + shift + residual?).
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    batch_norm_apply(const T* __restrict__ x, const T* __restrict__ residual, const float* __restrict__ scale_shift,
                     int64_t rows, int channels, int64_t rows_per_block, bool relu, T* __restrict__ y) {
  const int group = blockIdx.x * blockDim.x + threadIdx.x;
  if (group * V >= channels) return;
  const int c = group * V;
  float scale[V], shift[V];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    scale[i] = scale_shift[c + i];
    shift[i] = scale_shift[channels + c + i];
  }
  const RowRange range = rows_of_block(rows, rows_per_block);
  for (int64_t row = range.first + threadIdx.y; row < range.last; row += blockDim.y) {
    const int64_t at = row * channels + c;
    float v[V];
    load_as_floats(x + at, v);
    float r[V] = {};
    if (residual != nullptr) load_as_floats(residual + at, r);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float out = v[i] * scale[i] + shift[i] + r[i];
      v[i] = relu ? fmaxf(out, 0.f) : out;
    }
    store_from_floats(y + at, v);
  }
}

/// The gradient reaching the BatchNorm's output: ReLU passes it where the
/// output is positive.
template <typename T, int V>
__device__ __forceinline__ void gradient_before_relu(const T* grad_y, const T* y, int64_t at, bool relu,
                                                     float (&dz)[V]) {
  load_as_floats(grad_y + at, dz);
  if (!relu) return;
  float out[V];
  load_as_floats(y + at, out);
#pragma unroll
  for (int i = 0; i < V; ++i) dz[i] = out[i] > 0.f ? dz[i] : 0.f;
}

/// Per block along y and channel: sums of dz and of dz * (x - mean), in partial[2][gridDim.y][channels].
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    batch_norm_gradient_sums(const T* __restrict__ grad_y, const T* __restrict__ y, const T* __restrict__ x,
                             const float* __restrict__ mean, int64_t rows, int channels, int64_t rows_per_block,
                             bool relu, float* __restrict__ partial) {
  extern __shared__ float shared[];  // [blockDim.y][blockDim.x][2 V]
  const int group = blockIdx.x * blockDim.x + threadIdx.x;
  const bool owns = group * V < channels;
  const int c = group * V;
  float sum_dz[V] = {}, sum_dz_xc[V] = {};
  if (owns) {
    float mu[V];
#pragma unroll
    for (int i = 0; i < V; ++i) mu[i] = mean[c + i];
    const RowRange range = rows_of_block(rows, rows_per_block);
    for (int64_t row = range.first + threadIdx.y; row < range.last; row += blockDim.y) {
      const int64_t at = row * channels + c;
      float dz[V], v[V];
      gradient_before_relu(grad_y, y, at, relu, dz);
      load_as_floats(x + at, v);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        sum_dz[i] += dz[i];
        sum_dz_xc[i] += dz[i] * (v[i] - mu[i]);
      }
    }
  }
  float* mine = shared + (threadIdx.y * blockDim.x + threadIdx.x) * (2 * V);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    mine[i] = sum_dz[i];
    mine[V + i] = sum_dz_xc[i];
  }
  __syncthreads();
  if (threadIdx.y != 0 || !owns) return;
  for (unsigned other_y = 1; other_y < blockDim.y; ++other_y) {
    const float* other = shared + (other_y * blockDim.x + threadIdx.x) * (2 * V);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      sum_dz[i] += other[i];
      sum_dz_xc[i] += other[V + i];
    }
  }
  const int64_t plane = static_cast<int64_t>(gridDim.y) * channels;
  float* out = partial + static_cast<int64_t>(blockIdx.y) * channels + c;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    out[i] = sum_dz[i];
    out[plane + i] = sum_dz_xc[i];
  }
}

/// In a block of 32 x kFinishWays threads, channel blockIdx.x * 32 +
/// threadIdx.x: the blocks' sums of dz and dz * (x - mean) added up; true in
/// the thread (y = 0) that then holds them, false elsewhere.
__device__ __forceinline__ bool sum_partial_gradients(const float* __restrict__ partial, int parts, int channels,
                                                      float& sum_dz, float& sum_dz_xc) {
  __shared__ float summed[kFinishWays][32][2];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const int64_t plane = static_cast<int64_t>(parts) * channels;
  sum_dz = 0.f, sum_dz_xc = 0.f;
  if (c < channels) {
    for (int p = threadIdx.y; p < parts; p += kFinishWays) {
      const int64_t at = static_cast<int64_t>(p) * channels + c;
      sum_dz += partial[at];
      sum_dz_xc += partial[plane + at];
    }
  }
  summed[threadIdx.y][threadIdx.x][0] = sum_dz;
  summed[threadIdx.y][threadIdx.x][1] = sum_dz_xc;
  __syncthreads();
  if (threadIdx.y != 0 || c >= channels) return false;
  for (int way = 1; way < kFinishWays; ++way) {
    sum_dz += summed[way][threadIdx.x][0];
    sum_dz_xc += summed[way][threadIdx.x][1];
  }
  return true;
}

/// Channel c: the weight's and bias's gradients from this rank's sums, and
/// from the sums over all `rows` (every rank's, if synchronised) the
/// coefficients of dx = a * dz - b - k * (x - mean) in coefficients[3][channels].
__device__ __forceinline__ void finish_gradients_of_channel(
    int c, int channels, float sum_dz, float sum_dz_xc, float all_sum_dz, float all_sum_dz_xc, float rows,
    const float* __restrict__ weight, const float* __restrict__ invstd, float* __restrict__ grad_weight,
    float* __restrict__ grad_bias, float* __restrict__ coefficients) {
  const float istd = invstd[c];
  grad_weight[c] = sum_dz_xc * istd;
  grad_bias[c] = sum_dz;
  const float a = (weight != nullptr ? weight[c] : 1.f) * istd;
  const float per_row = 1.f / rows;
  coefficients[c] = a;
  coefficients[channels + c] = a * all_sum_dz * per_row;
  coefficients[2 * channels + c] = a * istd * istd * all_sum_dz_xc * per_row;
}

/// A block per 32 channels: the blocks' sums added up, then finished.
__global__ void __launch_bounds__(32 * kFinishWays)
    batch_norm_finish_gradients(const float* __restrict__ partial, int parts, int channels, int64_t rows,
                                const float* __restrict__ weight, const float* __restrict__ invstd,
                                float* __restrict__ grad_weight, float* __restrict__ grad_bias,
                                float* __restrict__ coefficients) {
  float sum_dz, sum_dz_xc;
  if (!sum_partial_gradients(partial, parts, channels, sum_dz, sum_dz_xc)) return;
  finish_gradients_of_channel(blockIdx.x * 32 + threadIdx.x, channels, sum_dz, sum_dz_xc, sum_dz, sum_dz_xc,
                              static_cast<float>(rows), weight, invstd, grad_weight, grad_bias, coefficients);
}

/// A block per 32 channels: this rank's sums for the all-reduce,
/// sums[2 channels] = {per channel the sum of dz, of dz * (x - mean)}, fp64 as the moments.
__global__ void __launch_bounds__(32 * kFinishWays)
    batch_norm_merge_gradient_sums(const float* __restrict__ partial, int parts, int channels,
                                   double* __restrict__ sums) {
  float sum_dz, sum_dz_xc;
  if (!sum_partial_gradients(partial, parts, channels, sum_dz, sum_dz_xc)) return;
  const int c = blockIdx.x * 32 + threadIdx.x;
  sums[c] = sum_dz;
  sums[channels + c] = sum_dz_xc;
}

/// A thread per channel: the gradients' coefficients from the all-reduced
/// sums and count, the weight's and bias's from this rank's sums.
__global__ void batch_norm_finish_global_gradients(const double* __restrict__ local_sums,
                                                   const double* __restrict__ global_sums,
                                                   const double* __restrict__ moments, int channels,
                                                   const float* __restrict__ weight, const float* __restrict__ invstd,
                                                   float* __restrict__ grad_weight, float* __restrict__ grad_bias,
                                                   float* __restrict__ coefficients) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  finish_gradients_of_channel(c, channels, static_cast<float>(local_sums[c]),
                              static_cast<float>(local_sums[channels + c]), static_cast<float>(global_sums[c]),
                              static_cast<float>(global_sums[channels + c]), static_cast<float>(moments[0]), weight,
                              invstd, grad_weight, grad_bias, coefficients);
}

/// dx = a * dz - b - k * (x - mean); the residual's gradient is dz.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    batch_norm_gradient_apply(const T* __restrict__ grad_y, const T* __restrict__ y, const T* __restrict__ x,
                              const float* __restrict__ mean, const float* __restrict__ coefficients, int64_t rows,
                              int channels, int64_t rows_per_block, bool relu, T* __restrict__ grad_x,
                              T* __restrict__ grad_residual) {
  const int group = blockIdx.x * blockDim.x + threadIdx.x;
  if (group * V >= channels) return;
  const int c = group * V;
  float a[V], b[V], k[V], mu[V];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    a[i] = coefficients[c + i];
    b[i] = coefficients[channels + c + i];
    k[i] = coefficients[2 * channels + c + i];
    mu[i] = mean[c + i];
  }
  const RowRange range = rows_of_block(rows, rows_per_block);
  for (int64_t row = range.first + threadIdx.y; row < range.last; row += blockDim.y) {
    const int64_t at = row * channels + c;
    float dz[V], v[V];
    gradient_before_relu(grad_y, y, at, relu, dz);
    if (grad_residual != nullptr) store_from_floats(grad_residual + at, dz);
    load_as_floats(x + at, v);
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = a[i] * dz[i] - b[i] - k[i] * (v[i] - mu[i]);
    store_from_floats(grad_x + at, v);
  }
}

/// Blocks of kThreads: x over groups of V channels, y over rows; enough
/// blocks along the rows to fill the device a few times over.
struct Launch {
  dim3 grid, block;
  int64_t rows_per_block = 0;
};

Launch launch_for(int64_t rows, int channels, int vector) {
  const int groups = channels / vector;
  const int threads_x = std::min(groups, 32);
  Launch launch;
  launch.block = dim3(threads_x, kThreads / threads_x);
  const int blocks_x = (groups + threads_x - 1) / threads_x;
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;  // cached by ATen per device
  // At least 8 rows per thread, so that the partial results stay few.
  const int64_t by_rows = std::max<int64_t>(1, rows / (static_cast<int64_t>(launch.block.y) * 8));
  const int64_t blocks_y = std::min<int64_t>(by_rows, std::max<int64_t>(1, 4 * sms / blocks_x));
  launch.rows_per_block = (rows + blocks_y - 1) / blocks_y;
  launch.grid = dim3(blocks_x, static_cast<unsigned>((rows + launch.rows_per_block - 1) / launch.rows_per_block));
  return launch;
}

template <typename T>
const T* data_of(const at::Tensor& tensor) {
  return tensor.defined() ? reinterpret_cast<const T*>(tensor.data_ptr()) : nullptr;
}
template <typename T>
T* mutable_data_of(const at::Tensor& tensor) {
  return tensor.defined() ? reinterpret_cast<T*>(tensor.data_ptr()) : nullptr;
}
float* floats_of(const at::Tensor& tensor) { return tensor.defined() ? tensor.data_ptr<float>() : nullptr; }

constexpr int kNarrowestVector = 4;

/// 16-byte loads where every activation allows them (16-bit types, channels
/// a multiple of 8, aligned pointers), else kNarrowestVector elements.
int vector_width(const at::Tensor& input, std::initializer_list<at::Tensor> activations) {
  if (input.element_size() != 2 || input.size(1) % 8 != 0) return kNarrowestVector;
  for (const at::Tensor& tensor : activations) {
    if (tensor.defined() && !aligned(tensor.data_ptr(), 16)) return kNarrowestVector;
  }
  return 8;
}

/// Calls f(T*, std::integral_constant<int, V>) for the CUDA type of `dtype` and the vector width.
template <typename F>
void dispatch(c10::ScalarType dtype, int vector, F&& f) {
  const auto widths = [&](auto* type) {
    if (vector == 8) {
      f(type, std::integral_constant<int, 8>{});
    } else {
      f(type, std::integral_constant<int, kNarrowestVector>{});
    }
  };
  switch (dtype) {
    case at::kFloat: f(static_cast<float*>(nullptr), std::integral_constant<int, kNarrowestVector>{}); break;
    case at::kBFloat16: widths(static_cast<__nv_bfloat16*>(nullptr)); break;
    case at::kHalf: widths(static_cast<__half*>(nullptr)); break;
    default: throw std::invalid_argument("fused_batch_norm: no kernel for this dtype");
  }
}

/// One call's activations: rows x channels, the vector width every one of
/// them allows and the launch over them (rows > 0 only).
struct Pass {
  cudaStream_t stream;
  int channels;
  int64_t rows;
  int vector;
  Launch launch;
};

Pass pass_over(const at::Tensor& input, std::initializer_list<at::Tensor> activations) {
  Pass pass;
  pass.stream = c10::cuda::getCurrentCUDAStream();
  pass.channels = static_cast<int>(input.size(1));
  pass.rows = input.numel() / pass.channels;
  pass.vector = vector_width(input, activations);
  if (pass.rows > 0) pass.launch = launch_for(pass.rows, pass.channels, pass.vector);
  return pass;
}

const dim3 kFinishBlock(32, kFinishWays);
dim3 finish_grid(int channels) { return dim3((channels + 31) / 32); }
constexpr int kChannelThreads = 128;
dim3 channel_grid(int channels) { return dim3((channels + kChannelThreads - 1) / kChannelThreads); }

/// Forward's first pass: each block's statistics, partial[3][blocks][channels].
at::Tensor statistics_pass(const Pass& pass, const at::Tensor& input) {
  const at::Tensor partial =
      at::empty({3, static_cast<int64_t>(pass.launch.grid.y), pass.channels}, input.options().dtype(at::kFloat));
  dispatch(input.scalar_type(), pass.vector, [&](auto* type, auto width) {
    using T = std::remove_pointer_t<decltype(type)>;
    constexpr int V = decltype(width)::value;
    const size_t shared = pass.launch.block.x * pass.launch.block.y * (1 + 2 * V) * sizeof(float);
    batch_norm_statistics<T, V><<<pass.launch.grid, pass.launch.block, shared, pass.stream>>>(
        data_of<T>(input), pass.rows, pass.channels, pass.launch.rows_per_block, partial.data_ptr<float>());
    DDP_CUDA_CHECK_LAUNCH("batch_norm_statistics");
  });
  return partial;
}

/// Forward's second pass: output = relu?(input * scale + shift + residual?).
void apply_pass(const Pass& pass, const at::Tensor& input, const at::Tensor& residual, const at::Tensor& scale_shift,
                bool relu, const at::Tensor& output) {
  dispatch(input.scalar_type(), pass.vector, [&](auto* type, auto width) {
    using T = std::remove_pointer_t<decltype(type)>;
    constexpr int V = decltype(width)::value;
    batch_norm_apply<T, V><<<pass.launch.grid, pass.launch.block, 0, pass.stream>>>(
        data_of<T>(input), data_of<T>(residual), scale_shift.data_ptr<float>(), pass.rows, pass.channels,
        pass.launch.rows_per_block, relu, mutable_data_of<T>(output));
    DDP_CUDA_CHECK_LAUNCH("batch_norm_apply");
  });
}

/// Backward's first pass: each block's sums of dz and dz * (x - mean), partial[2][blocks][channels].
at::Tensor gradient_sums_pass(const Pass& pass, const at::Tensor& grad_output, const at::Tensor& output,
                              const at::Tensor& input, const at::Tensor& mean, bool relu) {
  const at::Tensor partial =
      at::empty({2, static_cast<int64_t>(pass.launch.grid.y), pass.channels}, input.options().dtype(at::kFloat));
  dispatch(input.scalar_type(), pass.vector, [&](auto* type, auto width) {
    using T = std::remove_pointer_t<decltype(type)>;
    constexpr int V = decltype(width)::value;
    const size_t shared = pass.launch.block.x * pass.launch.block.y * (2 * V) * sizeof(float);
    batch_norm_gradient_sums<T, V><<<pass.launch.grid, pass.launch.block, shared, pass.stream>>>(
        data_of<T>(grad_output), data_of<T>(output), data_of<T>(input), mean.data_ptr<float>(), pass.rows,
        pass.channels, pass.launch.rows_per_block, relu, partial.data_ptr<float>());
    DDP_CUDA_CHECK_LAUNCH("batch_norm_gradient_sums");
  });
  return partial;
}

/// Backward's second pass: the input's gradient (and the residual's).
void gradient_apply_pass(const Pass& pass, const at::Tensor& grad_output, const at::Tensor& output,
                         const at::Tensor& input, const at::Tensor& mean, const at::Tensor& coefficients, bool relu,
                         const at::Tensor& grad_input, const at::Tensor& grad_residual) {
  dispatch(input.scalar_type(), pass.vector, [&](auto* type, auto width) {
    using T = std::remove_pointer_t<decltype(type)>;
    constexpr int V = decltype(width)::value;
    batch_norm_gradient_apply<T, V><<<pass.launch.grid, pass.launch.block, 0, pass.stream>>>(
        data_of<T>(grad_output), data_of<T>(output), data_of<T>(input), mean.data_ptr<float>(),
        coefficients.data_ptr<float>(), pass.rows, pass.channels, pass.launch.rows_per_block, relu,
        mutable_data_of<T>(grad_input), mutable_data_of<T>(grad_residual));
    DDP_CUDA_CHECK_LAUNCH("batch_norm_gradient_apply");
  });
}

}  // namespace

bool fits_synchronised_batch_norm(const at::Tensor& input) {
  const c10::ScalarType dtype = input.scalar_type();
  if (!input.is_cuda() || !(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf)) return false;
  return (input.dim() == 4 || input.dim() == 2) && input.size(1) > 0 && input.size(1) % kNarrowestVector == 0;
}

bool fits_fused_batch_norm(const at::Tensor& input) {
  const bool layout = (input.dim() == 4 && input.is_contiguous(at::MemoryFormat::ChannelsLast)) ||
                      (input.dim() == 2 && input.is_contiguous());
  return fits_synchronised_batch_norm(input) && layout && input.numel() > 0 &&
         aligned(input.data_ptr(), kNarrowestVector * input.element_size());
}

void fused_batch_norm_forward(const at::Tensor& input, const at::Tensor& residual, const at::Tensor& weight,
                              const at::Tensor& bias, const at::Tensor& running_mean, const at::Tensor& running_var,
                              double momentum, double eps, bool relu, const at::Tensor& output,
                              const at::Tensor& mean, const at::Tensor& invstd) {
  const c10::cuda::CUDAGuard guard(input.device());
  const Pass pass = pass_over(input, {input, residual, output});
  const at::Tensor partial = statistics_pass(pass, input);
  const at::Tensor scale_shift = at::empty({2, pass.channels}, input.options().dtype(at::kFloat));
  batch_norm_finish_statistics<<<finish_grid(pass.channels), kFinishBlock, 0, pass.stream>>>(
      partial.data_ptr<float>(), static_cast<int>(pass.launch.grid.y), pass.channels, floats_of(weight),
      floats_of(bias), floats_of(running_mean), floats_of(running_var), static_cast<float>(momentum),
      static_cast<float>(eps), mean.data_ptr<float>(), invstd.data_ptr<float>(), scale_shift.data_ptr<float>());
  DDP_CUDA_CHECK_LAUNCH("batch_norm_finish_statistics");
  apply_pass(pass, input, residual, scale_shift, relu, output);
}

void batch_norm_local_moments(const at::Tensor& input, const at::Tensor& moments) {
  const c10::cuda::CUDAGuard guard(input.device());
  const Pass pass = pass_over(input, {input});
  if (pass.rows == 0) {
    moments.zero_();
    return;
  }
  const at::Tensor partial = statistics_pass(pass, input);
  batch_norm_merge_moments<<<finish_grid(pass.channels), kFinishBlock, 0, pass.stream>>>(
      partial.data_ptr<float>(), static_cast<int>(pass.launch.grid.y), pass.channels, moments.data_ptr<double>());
  DDP_CUDA_CHECK_LAUNCH("batch_norm_merge_moments");
}

void fused_batch_norm_forward_from_moments(const at::Tensor& input, const at::Tensor& residual,
                                           const at::Tensor& weight, const at::Tensor& bias,
                                           const at::Tensor& running_mean, const at::Tensor& running_var,
                                           double momentum, double eps, bool relu, const at::Tensor& moments,
                                           const at::Tensor& output, const at::Tensor& mean, const at::Tensor& invstd) {
  const c10::cuda::CUDAGuard guard(input.device());
  const Pass pass = pass_over(input, {input, residual, output});
  const at::Tensor scale_shift = at::empty({2, pass.channels}, input.options().dtype(at::kFloat));
  batch_norm_finish_global_statistics<<<channel_grid(pass.channels), kChannelThreads, 0, pass.stream>>>(
      moments.data_ptr<double>(), pass.channels, floats_of(weight), floats_of(bias), floats_of(running_mean),
      floats_of(running_var), static_cast<float>(momentum), static_cast<float>(eps), mean.data_ptr<float>(),
      invstd.data_ptr<float>(), scale_shift.data_ptr<float>());
  DDP_CUDA_CHECK_LAUNCH("batch_norm_finish_global_statistics");
  if (pass.rows > 0) apply_pass(pass, input, residual, scale_shift, relu, output);
}

void fused_batch_norm_backward(const at::Tensor& grad_output, const at::Tensor& output, const at::Tensor& input,
                               const at::Tensor& weight, const at::Tensor& mean, const at::Tensor& invstd, bool relu,
                               const at::Tensor& grad_input, const at::Tensor& grad_residual,
                               const at::Tensor& grad_weight, const at::Tensor& grad_bias) {
  const c10::cuda::CUDAGuard guard(input.device());
  const Pass pass = pass_over(input, {grad_output, output, input, grad_input, grad_residual});
  const at::Tensor partial = gradient_sums_pass(pass, grad_output, output, input, mean, relu);
  const at::Tensor coefficients = at::empty({3, pass.channels}, input.options().dtype(at::kFloat));
  batch_norm_finish_gradients<<<finish_grid(pass.channels), kFinishBlock, 0, pass.stream>>>(
      partial.data_ptr<float>(), static_cast<int>(pass.launch.grid.y), pass.channels, pass.rows, floats_of(weight),
      invstd.data_ptr<float>(), grad_weight.data_ptr<float>(), grad_bias.data_ptr<float>(),
      coefficients.data_ptr<float>());
  DDP_CUDA_CHECK_LAUNCH("batch_norm_finish_gradients");
  gradient_apply_pass(pass, grad_output, output, input, mean, coefficients, relu, grad_input, grad_residual);
}

void batch_norm_local_gradient_sums(const at::Tensor& grad_output, const at::Tensor& output, const at::Tensor& input,
                                    const at::Tensor& mean, bool relu, const at::Tensor& sums) {
  const c10::cuda::CUDAGuard guard(input.device());
  const Pass pass = pass_over(input, {grad_output, output, input});
  if (pass.rows == 0) {
    sums.zero_();
    return;
  }
  const at::Tensor partial = gradient_sums_pass(pass, grad_output, output, input, mean, relu);
  batch_norm_merge_gradient_sums<<<finish_grid(pass.channels), kFinishBlock, 0, pass.stream>>>(
      partial.data_ptr<float>(), static_cast<int>(pass.launch.grid.y), pass.channels, sums.data_ptr<double>());
  DDP_CUDA_CHECK_LAUNCH("batch_norm_merge_gradient_sums");
}

void fused_batch_norm_backward_from_sums(const at::Tensor& grad_output, const at::Tensor& output,
                                         const at::Tensor& input, const at::Tensor& weight, const at::Tensor& mean,
                                         const at::Tensor& invstd, bool relu, const at::Tensor& local_sums,
                                         const at::Tensor& global_sums, const at::Tensor& moments,
                                         const at::Tensor& grad_input, const at::Tensor& grad_residual,
                                         const at::Tensor& grad_weight, const at::Tensor& grad_bias) {
  const c10::cuda::CUDAGuard guard(input.device());
  const Pass pass = pass_over(input, {grad_output, output, input, grad_input, grad_residual});
  const at::Tensor coefficients = at::empty({3, pass.channels}, input.options().dtype(at::kFloat));
  batch_norm_finish_global_gradients<<<channel_grid(pass.channels), kChannelThreads, 0, pass.stream>>>(
      local_sums.data_ptr<double>(), global_sums.data_ptr<double>(), moments.data_ptr<double>(), pass.channels,
      floats_of(weight), invstd.data_ptr<float>(), grad_weight.data_ptr<float>(), grad_bias.data_ptr<float>(),
      coefficients.data_ptr<float>());
  DDP_CUDA_CHECK_LAUNCH("batch_norm_finish_global_gradients");
  if (pass.rows > 0) {
    gradient_apply_pass(pass, grad_output, output, input, mean, coefficients, relu, grad_input, grad_residual);
  }
}

}  // namespace ddp::detail
