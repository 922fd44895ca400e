// RMSNorm written straight into FP8: the norm of a pre-norm block whose
// output only a Float8Linear reads (attention's projections, SwiGLU's gate
// and up). Unfused, the norm writes its bf16 output and the layer's cast
// reads it again to write the FP8 data and transpose; here the norm writes
// those itself, and the bf16 output never exists.
//
// A block normalises a strip of 32 rows. Each warp takes a row at a time:
// the first pass sums its squares (and, with a residual, writes x + delta),
// the second reads the row back from L2, scales, converts, and writes the
// FP8 row to `data` and to a shared-memory copy of the strip. Then the block
// writes the strip's transpose: 32 rows make each transposed row's piece 32
// bytes, one whole memory sector, where a block per row would write single
// bytes scattered over every transposed row.
//
// Backward, with a residual: the norm's backward kernel (rmsnorm/
// backward_kernel.cuh) writes the gradient of delta as the FP8 output
// gradient of the layer that computed delta, row-major, and a transpose
// kernel then writes its transpose; the bf16 gradient never exists.

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include "cuda/cuda_check.h"
#include "cuda/float_conversions.cuh"
#include "cuda/packs.cuh"
#include "cuda/warp_reduce.cuh"
#include "float8/kernels.h"
#include "float8/tile.cuh"
#include "rmsnorm/backward_kernel.cuh"

namespace ddp::detail {
namespace {

constexpr int kStripRows = 32;
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kPack = 8;    // elements a lane moves at a time: 16 bytes of bf16, 32 of fp32
constexpr int kUnroll = 2;  // packs a lane loads before it uses the first, to keep loads in flight
// Blocks an SM runs at once: registers for two (up to 128 a thread; ptxas,
// sm_90: 91-112, where asking for three made fp32 rows spill), which with
// two packs in flight per lane keep 48 KiB of loads in flight per SM.
constexpr int kBlocksPerSm = 2;

/// A thread's largest |value| as float bits (abs_bits), maxed over the block
/// of kWarps warps and max-accumulated into *amax by one atomic. Every
/// thread of the block calls it. Its warp_amax is the kernels' only static
/// shared memory (dynamic_shared_limit counts it).
__device__ __forceinline__ void accumulate_block_amax(int max_bits, float* amax) {
  __shared__ int warp_amax[kWarps];
  max_bits = warp_max(max_bits);
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = max_bits;
  __syncthreads();
  if (threadIdx.x == 0) {
    int bits = warp_amax[0];
    for (int w = 1; w < kWarps; ++w) bits = max(bits, warp_amax[w]);
    atomicMax(reinterpret_cast<int*>(amax), bits);
  }
}

/// Words from one row of the shared strip to the next: the row's cols / 4
/// words, padded to 2 more than a multiple of 8. Even, for the 8-byte
/// writes; and the transposing reads (8 rows 4 apart x 4 words per warp)
/// then fall in 16 banks twice, where a stride of 4 more than a multiple of
/// 32 put them in 8 banks four times.
__host__ __device__ int64_t strip_stride_words(int64_t cols) { return (cols / 4 + 5) / 8 * 8 + 2; }

struct NormToFloat8Args {
  const void* x;      // [rows, cols], In
  const void* delta;  // [rows, cols], Delta; null: no residual
  void* sum;          // [rows, cols], In: x + delta; null without residual
  const float* weight;
  float* rstd;  // [rows]
  uint8_t* data;
  uint8_t* transposed;  // [cols, rows]
  const float* scale;
  float* inverse_scale;
  float* amax;
  int64_t rows, cols;
  float eps;
};

template <typename In, typename Delta, bool kResidual, __nv_fp8_interpretation_t kFormat>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) rms_norm_to_float8_kernel(const NormToFloat8Args args) {
  extern __shared__ __align__(16) uint32_t strip[];  // [kStripRows][strip_stride_words(cols)]
  const int64_t cols = args.cols;
  const int64_t stride_words = strip_stride_words(cols);
  const int64_t packs = cols / kPack;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kStripRows;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const float scale = __ldg(args.scale);
  if (blockIdx.x == 0 && threadIdx.x == 0) *args.inverse_scale = 1.0f / scale;
  int max_bits = 0;

  for (int strip_row = warp; strip_row < kStripRows; strip_row += kWarps) {
    const int64_t row = row0 + strip_row;
    if (row >= args.rows) break;
    const In* x = static_cast<const In*>(args.x) + row * cols;
    const Delta* delta = kResidual ? static_cast<const Delta*>(args.delta) + row * cols : nullptr;
    In* sum = kResidual ? static_cast<In*>(args.sum) + row * cols : nullptr;
    float squares = 0;
    for (int64_t first = lane; first < packs; first += 32 * kUnroll) {
      float h[kUnroll][kPack];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t pack = first + 32 * u;
        if (pack < packs) load_as_floats(x + pack * kPack, h[u]);
      }
      if constexpr (kResidual) {
        float d[kUnroll][kPack];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t pack = first + 32 * u;
          if (pack < packs) load_as_floats(delta + pack * kPack, d[u]);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t pack = first + 32 * u;
          if (pack >= packs) continue;
            // Rounded to the stream's dtype first, as the unfused add writes it
            // and as backward will read it.
#pragma unroll
          for (int k = 0; k < kPack; ++k) h[u][k] = to_float(from_float<In>(h[u][k] + d[u][k]));
          store_from_floats(sum + pack * kPack, h[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (first + 32 * u >= packs) continue;
#pragma unroll
        for (int k = 0; k < kPack; ++k) squares += h[u][k] * h[u][k];
      }
    }
    const float r = rsqrtf(warp_sum(squares) / static_cast<float>(cols) + args.eps);
    if (lane == 0) args.rstd[row] = r;

    // The row again, from L2 (this warp just read or wrote it).
    const In* normed = kResidual ? sum : x;
    uint8_t* const data = args.data + row * cols;
    uint32_t* const strip_row_words = strip + strip_row * stride_words;
    for (int64_t first = lane; first < packs; first += 32 * kUnroll) {
      float h[kUnroll][kPack], w[kUnroll][kPack];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t pack = first + 32 * u;
        if (pack >= packs) continue;
        load_as_floats(normed + pack * kPack, h[u]);
        load_as_floats(args.weight + pack * kPack, w[u]);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t pack = first + 32 * u;
        if (pack >= packs) continue;
        float y[kPack];
#pragma unroll
        for (int k = 0; k < kPack; ++k) {
          // The value the unfused norm would round to its output dtype (Delta,
          // the dtype the linear layers compute in) before the cast read it.
          const float value = to_float(from_float<Delta>(h[u][k] * r * w[u][k]));
          max_bits = max(max_bits, abs_bits(value));
          y[k] = value * scale;
        }
        const uint2 words =
            make_uint2(to_float8x4<kFormat>(y[0], y[1], y[2], y[3]), to_float8x4<kFormat>(y[4], y[5], y[6], y[7]));
        *reinterpret_cast<uint2*>(data + pack * kPack) = words;
        *reinterpret_cast<uint2*>(strip_row_words + pack * (kPack / 4)) = words;
      }
    }
  }
  __syncthreads();

  // The transpose: each thread turns a 4 x 4 block of bytes (4 rows' words of
  // the same 4 columns) into 4 words of 4 rows, one per column. A warp takes
  // 8 blocks down (the strip's 32 rows) and 4 across, so that the 8 lanes of
  // a column write its 32 bytes together.
  const int block_row = lane % 8;  // in 4-row units
  if (row0 + 4 * block_row < args.rows) {
    const int64_t row = row0 + 4 * block_row;
    for (int64_t block_col = lane / 8 + 4 * warp; block_col < cols / 4; block_col += 4 * kWarps) {
      uint32_t in[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) in[r] = strip[(4 * block_row + r) * stride_words + block_col];
      uint32_t columns[4];
      transpose_4x4_bytes(in, columns);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        *reinterpret_cast<uint32_t*>(args.transposed + (4 * block_col + c) * args.rows + row) = columns[c];
      }
    }
  }

  accumulate_block_amax(max_bits, args.amax);
}

/// The delta's gradient as FP8 (backward_kernel.cuh's writer): each value
/// rounded to Out, the dtype the unfused backward writes and the layer's
/// cast reads, then scaled and converted, into the cast's row-major data; its
/// amax max-accumulated into the cast's.
template <typename Out, __nv_fp8_interpretation_t kFormat>
struct DeltaAsFloat8 {
  static constexpr bool kAlsoWithoutDelta = false;
  uint8_t* data;  // [rows, cols]
  const float* scale;
  float* inverse_scale;
  float* amax;
  float scale_value;
  int max_bits;

  __device__ __forceinline__ void begin() {
    scale_value = __ldg(scale);
    max_bits = 0;
    if (blockIdx.x == 0 && threadIdx.x == 0) *inverse_scale = 1.0f / scale_value;
  }
  template <typename In, int N>
  __device__ __forceinline__ void write(int64_t row_offset, int64_t i, const Pack<In, N>& grad) {
    float y[N];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float value = to_float(from_float<Out>(to_float(grad.v[k])));
      max_bits = max(max_bits, abs_bits(value));
      y[k] = value * scale_value;
    }
    uint8_t* const out = data + row_offset + i * N;
    if constexpr (N == 4) {
      *reinterpret_cast<uint32_t*>(out) = to_float8x4<kFormat>(y[0], y[1], y[2], y[3]);
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k) out[k] = __nv_cvt_float_to_fp8(y[k], __NV_SATFINITE, kFormat);
    }
  }
  __device__ __forceinline__ void finish() { accumulate_block_amax(max_bits, amax); }
};
static_assert(rms_norm_kernels::kThreads == kThreads, "accumulate_block_amax counts the backward's warps as kWarps");

/// The dynamic shared memory of a block: the strip of FP8 rows.
int64_t shared_bytes(int64_t cols) {
  return kStripRows * strip_stride_words(cols) * static_cast<int64_t>(sizeof(uint32_t));
}

/// The dynamic shared memory a block on `device` may have: the opt-in less
/// the kernel's static warp_amax (accumulate_block_amax's; the attribute
/// refuses more). The kernels
/// are allowed all of it, so that no launch shrinks what another relies on.
int dynamic_shared_limit(int device) {
  int bytes = 0;
  DDP_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return bytes - static_cast<int>(sizeof(int)) * kWarps;
}

}  // namespace

bool rms_norm_to_float8_takes(const at::Tensor& x, const at::Tensor& delta) {
  if (!x.is_cuda() || x.dim() < 1 || x.numel() == 0) return false;
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  const auto fits = [&](const at::Tensor& t) {
    return !t.defined() || (t.is_contiguous() && t.device() == x.device() && aligned(t.data_ptr(), 16));
  };
  const auto dtype = x.scalar_type();
  return (dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf) && rows % 16 == 0 && cols % 16 == 0 &&
         rows / kStripRows < INT32_MAX && fits(x) && fits(delta) &&
         shared_bytes(cols) <= dynamic_shared_limit(x.get_device());
}

void rms_norm_to_float8(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps,
                        c10::ScalarType out_dtype, const at::Tensor& sum, const at::Tensor& rstd, Float8Tensor& y) {
  TORCH_CHECK(x.dim() == 2 && rms_norm_to_float8_takes(x, delta), "rms_norm_to_float8: x ", x.sizes(), " ",
              x.scalar_type(), " (with delta) does not fit: see rms_norm_to_float8_takes");
  const int64_t rows = x.size(0), cols = x.size(1);
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.is_contiguous() && weight.numel() == cols &&
                  aligned(weight.data_ptr(), 16),
              "rms_norm_to_float8: weight must be contiguous fp32 [cols], 16-byte aligned");
  TORCH_CHECK(rstd.scalar_type() == at::kFloat && rstd.numel() == rows, "rms_norm_to_float8: rstd must be fp32 [rows]");
  TORCH_CHECK(y.data.sizes() == x.sizes() && y.data.is_contiguous() && y.transposed.size(0) == cols &&
                  y.transposed.size(1) == rows && y.transposed.is_contiguous(),
              "rms_norm_to_float8: y must have contiguous data [rows, cols] and transpose [cols, rows]");
  const bool residual = delta.defined();
  if (residual) {
    TORCH_CHECK(delta.sizes() == x.sizes() && delta.is_contiguous() && delta.scalar_type() == out_dtype &&
                    sum.sizes() == x.sizes() && sum.is_contiguous() && sum.scalar_type() == x.scalar_type(),
                "rms_norm_to_float8: delta (of x's shape, in out_dtype) and sum (of x's shape and dtype) must be "
                "contiguous");
  }
  // Packs of 8: 16-byte accesses to sum, 8-byte stores of data, 4-byte of the transpose.
  TORCH_CHECK((!sum.defined() || aligned(sum.data_ptr(), 16)) && aligned(y.data.data_ptr(), 8) &&
                  aligned(y.transposed.data_ptr(), 4),
              "rms_norm_to_float8: sum, data and transposed must be aligned for their packs");
  NormToFloat8Args args{};
  args.x = x.data_ptr();
  args.delta = residual ? delta.data_ptr() : nullptr;
  args.sum = residual ? sum.data_ptr() : nullptr;
  args.weight = weight.data_ptr<float>();
  args.rstd = rstd.data_ptr<float>();
  args.data = static_cast<uint8_t*>(y.data.data_ptr());
  args.transposed = static_cast<uint8_t*>(y.transposed.data_ptr());
  args.scale = y.scale.data_ptr<float>();
  args.inverse_scale = y.inverse_scale.data_ptr<float>();
  args.amax = y.amax.data_ptr<float>();
  args.rows = rows;
  args.cols = cols;
  args.eps = static_cast<float>(eps);

  const c10::cuda::CUDAGuard device_guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.get_device());
  const auto bytes = static_cast<int>(shared_bytes(cols));
  const int allowed_bytes = dynamic_shared_limit(x.get_device());
  const auto blocks = static_cast<unsigned>((rows + kStripRows - 1) / kStripRows);
  const bool e4m3 = y.data.scalar_type() == at::kFloat8_e4m3fn;
  with_cuda_types(x.scalar_type(), out_dtype, "rms_norm_to_float8", [&](auto* in_type, auto* out_type) {
    using In = std::remove_pointer_t<decltype(in_type)>;
    using Out = std::remove_pointer_t<decltype(out_type)>;
    const auto launch = [&](auto kernel) {
      // More than the default 48 KiB of dynamic shared memory must be asked
      // for; always the device's whole opt-in, so that two threads
      // launching for different widths cannot shrink each other's.
      DDP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, allowed_bytes));
      kernel<<<blocks, kThreads, bytes, stream>>>(args);
      DDP_CUDA_CHECK_LAUNCH("rms_norm_to_float8_kernel");
    };
    if (residual) {
      e4m3 ? launch(rms_norm_to_float8_kernel<In, Out, true, __NV_E4M3>)
           : launch(rms_norm_to_float8_kernel<In, Out, true, __NV_E5M2>);
    } else {
      e4m3 ? launch(rms_norm_to_float8_kernel<In, Out, false, __NV_E4M3>)
           : launch(rms_norm_to_float8_kernel<In, Out, false, __NV_E5M2>);
    }
  });
}

bool add_rms_norm_backward_to_float8_takes(const at::Tensor& h) {
  if (!h.is_cuda() || h.dim() < 1 || h.numel() == 0) return false;
  const int64_t cols = h.size(-1), rows = h.numel() / cols;
  const auto dtype = h.scalar_type();
  return (dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf) && rows % 16 == 0 && cols % 16 == 0;
}

std::pair<at::Tensor, at::Tensor> add_rms_norm_backward_to_float8(const at::Tensor& grad_y, const at::Tensor& grad_h,
                                                                  const at::Tensor& h, const at::Tensor& weight,
                                                                  const at::Tensor& rstd, Float8Tensor& grad_delta) {
  constexpr const char* what = "add_rms_norm_backward_to_float8";
  TORCH_CHECK(add_rms_norm_backward_to_float8_takes(h), what, ": h ", h.sizes(), " ", h.scalar_type(),
              " does not fit: see add_rms_norm_backward_to_float8_takes");
  const int64_t cols = h.size(-1), rows = h.numel() / cols;
  const auto on_h = [&](const at::Tensor& t) { return t.is_cuda() && t.device() == h.device() && t.is_contiguous(); };
  TORCH_CHECK(on_h(h) && on_h(grad_y) && grad_y.sizes() == h.sizes() &&
                  (!grad_h.defined() ||
                   (on_h(grad_h) && grad_h.sizes() == h.sizes() && grad_h.scalar_type() == h.scalar_type())),
              what, ": grad_y of h's shape, and grad_h (if defined) of h's shape and dtype, contiguous on h's device");
  TORCH_CHECK(on_h(weight) && weight.scalar_type() == at::kFloat && weight.numel() == cols && on_h(rstd) &&
                  rstd.scalar_type() == at::kFloat && rstd.numel() == rows,
              what, ": fp32 weight [cols] and rstd [rows] expected");
  TORCH_CHECK(grad_delta.data.is_contiguous() && grad_delta.data.size(0) == rows && grad_delta.data.size(1) == cols &&
                  grad_delta.transposed.is_contiguous() && grad_delta.transposed.size(0) == cols &&
                  grad_delta.transposed.size(1) == rows && aligned(grad_delta.data.data_ptr(), 4),
              what, ": grad_delta must have contiguous data [rows, cols], 4-byte aligned, and transpose [cols, rows]");
  const at::Tensor grad_x = at::empty_like(h);
  // Output gradients are E5M2 (Float8Linear's recipe): the one format made.
  TORCH_CHECK(grad_delta.data.scalar_type() == at::kFloat8_e5m2, what, ": grad_delta must be E5M2, got ",
              grad_delta.data.scalar_type());
  const at::Tensor grad_weight = rms_norm_kernels::launch_rms_norm_backward(
      what, grad_y, grad_h, h, weight, rstd, grad_x, /*residual=*/true, /*delta_packs_fit=*/true, [&](auto* out_type) {
        using Out = std::remove_pointer_t<decltype(out_type)>;
        return DeltaAsFloat8<Out, __NV_E5M2>{static_cast<uint8_t*>(grad_delta.data.data_ptr()),
                                             grad_delta.scale.data_ptr<float>(),
                                             grad_delta.inverse_scale.data_ptr<float>(),
                                             grad_delta.amax.data_ptr<float>(),
                                             0.0f,
                                             0};
      });
  transpose_float8(grad_delta.data, grad_delta.transposed);
  return {grad_x, grad_weight};
}
}  // namespace ddp::detail
