#pragma once

// The FP8 cast kernel as a template over what it casts: a functor turns the
// values of a few input tensors at one position into the values of one or
// more outputs, and the kernel writes each output as a Float8Tensor
// (row-major, transposed, or both, with its amax) in one pass. With the
// identity it is the plain cast (cast_transpose.cu); a kernel that computes a
// Float8Linear's input or output gradient elementwise (SwiGLU, swiglu.cu)
// instantiates it with its own arithmetic and so writes the FP8 tensors the
// matmuls read, instead of writing bf16 for a cast to read again.
//
// Private to libddp's .cu files; host code uses float8/kernels.h.

#include <algorithm>
#include <cstdint>
#include <iterator>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include "cuda/cuda_check.h"
#include "cuda/float8_bytes.cuh"
#include "cuda/float_conversions.cuh"
#include "cuda/packs.cuh"
#include "cuda/warp_reduce.cuh"
#include "float8/kernels.h"

namespace ddp::detail::float8_tiles {

// One block casts a tile of 64 columns and tile_rows() rows: each thread
// loads 16 bytes of each input at a time, and the tile is small enough (4 or
// 8 KiB of FP8 per output) for several blocks per SM to keep enough loads in
// flight for a memory-bound kernel.
constexpr int kTile = 64;
constexpr int kThreads = 256;

/// Rows of a tile: 64, or more where that would leave a thread fewer than
/// four 16-byte loads in flight (one bf16 or fp16 input: 32 rows per pass,
/// 128 rows). With two loads per thread the bf16 casts ran at 0.70 of the
/// copy bandwidth, where fp32's four reached 0.89 (H200, 2026-11-26); with
/// 128 rows 0.92-0.95 against 0.88 in an A/B on one H100 (2026-11-28).
template <typename T, int kInputs>
__host__ __device__ constexpr int tile_rows() {
  constexpr int rows_per_pass = kThreads / (kTile / static_cast<int>(16 / sizeof(T)));
  constexpr int four_loads = rows_per_pass * 4 / kInputs;
  return four_loads > kTile ? four_loads : kTile;
}
// Row stride of an FP8 tile in shared memory, in 32-bit words: odd, so that
// the transposing reads (8 rows x 4 words per warp) hit 32 different banks.
constexpr int kTileStrideWords = kTile / 4 + 1;

/// ATen's clamp_min: a NaN amax stays NaN (fmaxf would replace it).
__device__ __forceinline__ float at_least_min_amax(float amax) { return amax < kFloat8MinAmax ? kFloat8MinAmax : amax; }

/// A Float8Tensor as the kernel sees it: null pointers are not written.
/// scale_from_amax: `scale_source` is the amax, and the kernel writes the
/// scale it takes from it to `scale`; otherwise `scale_source` is the scale
/// and the output's amax is max-accumulated into `amax` (if not null).
struct TileOutput {
  uint8_t* data;
  uint8_t* transposed;
  float* amax;
  float* scale;
  float* inverse_scale;
  const float* scale_source;
  bool scale_from_amax;
};

template <int kInputs, int kOutputs>
struct TileArgs {
  const void* inputs[kInputs];  // [rows, cols] row-major, one dtype
  TileOutput outputs[kOutputs];
  float largest;
  int64_t rows, cols, col_tiles;
  // Elements from one row to the next: cols, or more where the matrices are
  // column ranges of wider ones (the gate and up halves of one projection).
  int64_t input_strides[kInputs], output_stride;
  // vectorized: the inputs, the data outputs, cols and the strides allow
  // 16-byte loads and (16 / element size)-byte stores; rows_aligned: rows and
  // the transposed outputs allow 4-byte stores. Tiles at the edges check
  // their bounds.
  bool vectorized, rows_aligned;
};

/// The cast of one tile (64 columns, tile_rows() rows): loads every input at a position, calls
/// compute(x, y) with their values as floats (x[kInputs] -> y[kOutputs]),
/// and writes y[o] * scale_o, saturated, to output o: row-major to `data`,
/// and with kTransposed to `transposed` ([cols, rows] row-major) through
/// shared memory, so that both the reads and the writes of the transposed
/// copy are coalesced. With kAmax, max |y[o]| is max-accumulated into *amax.
/// The scale is *scale_source, or largest / *scale_source if
/// scale_from_amax; the first block writes its inverse to *inverse_scale
/// (and, taken from the amax, the scale itself to *scale).
template <typename T, int kInputs, int kOutputs, typename Compute, __nv_fp8_interpretation_t kFormat, bool kTransposed,
          bool kAmax>
__global__ void __launch_bounds__(kThreads)
    float8_tile_kernel(const TileArgs<kInputs, kOutputs> args, const Compute compute) {
  constexpr int kVector = 16 / sizeof(T);  // elements per 16-byte load
  constexpr int kVectorsPerRow = kTile / kVector;
  constexpr int kRowsPerPass = kThreads / kVectorsPerRow;
  constexpr int kTileRows = tile_rows<T, kInputs>();
  constexpr int kPasses = kTileRows / kRowsPerPass;  // rows of the tile each thread casts
  static_assert(kVector % 4 == 0 && kThreads % kVectorsPerRow == 0 && kTileRows % kRowsPerPass == 0 &&
                kTileRows % kTile == 0);

  __shared__ uint32_t tile[kTransposed ? kOutputs : 1][kTileRows * kTileStrideWords];
  __shared__ int warp_amax[kOutputs][kThreads / 32];

  const int64_t rows = args.rows;
  const int64_t cols = args.cols;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) / args.col_tiles * kTileRows;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) % args.col_tiles * kTile;
  float scale[kOutputs];
  int max_bits[kOutputs];
#pragma unroll
  for (int o = 0; o < kOutputs; ++o) {
    const TileOutput& out = args.outputs[o];
    const float source = __ldg(out.scale_source);
    scale[o] = out.scale_from_amax ? args.largest / at_least_min_amax(source) : source;
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      *out.inverse_scale = 1.0f / scale[o];
      if (out.scale_from_amax) *out.scale = scale[o];
    }
    max_bits[o] = 0;
  }

  const int tile_col = threadIdx.x % kVectorsPerRow * kVector;
  const int first_tile_row = threadIdx.x / kVectorsPerRow;
  const int64_t col = col0 + tile_col;
  if (col < cols) {
    const bool full = args.vectorized && col + kVector <= cols;
    // Every load of this thread first, so that they are in flight together:
    // a block moves only a few KiB, and waiting for one load at a time would
    // leave the memory system idle.
    alignas(16) T loaded[kPasses][kInputs][kVector];
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int64_t row = row0 + first_tile_row + pass * kRowsPerPass;
      if (row >= rows) break;
#pragma unroll
      for (int in = 0; in < kInputs; ++in) {
        const T* input = static_cast<const T*>(args.inputs[in]);
        const int64_t offset = row * args.input_strides[in] + col;
        if (full) {
          *reinterpret_cast<uint4*>(loaded[pass][in]) = __ldg(reinterpret_cast<const uint4*>(input + offset));
        } else {
          // Zeros past the edge: never stored, and left out of the amax.
#pragma unroll
          for (int i = 0; i < kVector; ++i) loaded[pass][in][i] = col + i < cols ? input[offset + i] : T(0.0f);
        }
      }
    }
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int tile_row = first_tile_row + pass * kRowsPerPass;
      const int64_t row = row0 + tile_row;
      if (row >= rows) break;
      const int64_t offset = row * args.output_stride + col;
      uint32_t words[kOutputs][kVector / 4];
#pragma unroll
      for (int w = 0; w < kVector / 4; ++w) {
        float v[kOutputs][4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float x[kInputs];
#pragma unroll
          for (int in = 0; in < kInputs; ++in) x[in] = to_float(loaded[pass][in][4 * w + i]);
          float y[kOutputs];
          compute(x, y);
          const bool inside = full || col + 4 * w + i < cols;
#pragma unroll
          for (int o = 0; o < kOutputs; ++o) {
            if constexpr (kAmax) {
              if (inside) max_bits[o] = max(max_bits[o], abs_bits(y[o]));
            }
            v[o][i] = y[o] * scale[o];
          }
        }
#pragma unroll
        for (int o = 0; o < kOutputs; ++o) {
          words[o][w] = to_float8x4<kFormat>(v[o][0], v[o][1], v[o][2], v[o][3]);
          if constexpr (kTransposed) tile[o][tile_row * kTileStrideWords + tile_col / 4 + w] = words[o][w];
        }
      }
#pragma unroll
      for (int o = 0; o < kOutputs; ++o) {
        uint8_t* const out = args.outputs[o].data;
        if (out == nullptr) continue;
        if (full) {
          if constexpr (kVector == 8) {
            *reinterpret_cast<uint2*>(out + offset) = make_uint2(words[o][0], words[o][1]);
          } else {
            *reinterpret_cast<uint32_t*>(out + offset) = words[o][0];
          }
        } else {
#pragma unroll
          for (int i = 0; i < kVector; ++i) {
            if (col + i < cols) out[offset + i] = words[o][i / 4] >> (8 * (i % 4)) & 0xFF;
          }
        }
      }
    }
  }

  if constexpr (kTransposed) {
    __syncthreads();
    // Each thread transposes 4 x 4 blocks of bytes: 4 rows' words of the
    // same 4 columns become 4 words of 4 rows each, one per column. A warp
    // covers 8 blocks down (32 bytes of each output row) and 4 across; the
    // block's warps cover 64 rows at a time.
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    const int block_col = lane / 8 + 4 * (warp / 2);  // in 4-column units
#pragma unroll
    for (int block_row = lane % 8 + 8 * (warp % 2); block_row < kTileRows / 4; block_row += 16) {  // in 4-row units
      const int64_t row = row0 + 4 * block_row;
#pragma unroll
      for (int o = 0; o < kOutputs; ++o) {
        uint8_t* const out_t = args.outputs[o].transposed;
        if (out_t == nullptr || row >= rows) continue;
        uint32_t in[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) in[r] = tile[o][(4 * block_row + r) * kTileStrideWords + block_col];
        uint32_t columns[4];
        transpose_4x4_bytes(in, columns);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int64_t out_row = col0 + 4 * block_col + c;
          if (out_row >= cols) break;
          uint8_t* destination = out_t + out_row * rows + row;
          if (args.rows_aligned) {
            *reinterpret_cast<uint32_t*>(destination) = columns[c];
          } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              if (row + i < rows) destination[i] = columns[c] >> (8 * i) & 0xFF;
            }
          }
        }
      }
    }
  }

  if constexpr (kAmax) {
#pragma unroll
    for (int o = 0; o < kOutputs; ++o) {
      max_bits[o] = detail::warp_max(max_bits[o]);
      if (threadIdx.x % 32 == 0) warp_amax[o][threadIdx.x / 32] = max_bits[o];
    }
    __syncthreads();
    if (threadIdx.x < kOutputs) {
      const int o = static_cast<int>(threadIdx.x);
      int bits = warp_amax[o][0];
      for (int w = 1; w < kThreads / 32; ++w) bits = max(bits, warp_amax[o][w]);
      atomicMax(reinterpret_cast<int*>(args.outputs[o].amax), bits);
    }
  }
}

template <typename T, int kInputs, int kOutputs, typename Compute, __nv_fp8_interpretation_t kFormat>
void launch_with_format(const TileArgs<kInputs, kOutputs>& args, const Compute& compute, dim3 grid,
                        cudaStream_t stream) {
  // The outputs of one launch all have a transpose or none, an amax or none
  // (launch_float8_tiles checks).
  const bool transposed = args.outputs[0].transposed != nullptr;
  const bool amax = args.outputs[0].amax != nullptr;
  if (transposed && amax) {
    float8_tile_kernel<T, kInputs, kOutputs, Compute, kFormat, true, true>
        <<<grid, kThreads, 0, stream>>>(args, compute);
  } else if (transposed) {
    float8_tile_kernel<T, kInputs, kOutputs, Compute, kFormat, true, false>
        <<<grid, kThreads, 0, stream>>>(args, compute);
  } else if (amax) {
    float8_tile_kernel<T, kInputs, kOutputs, Compute, kFormat, false, true>
        <<<grid, kThreads, 0, stream>>>(args, compute);
  } else {
    float8_tile_kernel<T, kInputs, kOutputs, Compute, kFormat, false, false>
        <<<grid, kThreads, 0, stream>>>(args, compute);
  }
  DDP_CUDA_CHECK_LAUNCH("float8_tile_kernel");
}

inline void check_scalar(const at::Tensor& tensor, const at::Tensor& like, const char* what, const char* name) {
  TORCH_CHECK(tensor.device() == like.device() && tensor.dim() == 0 && tensor.scalar_type() == at::kFloat, what, name,
              " must be a 0-dim fp32 tensor on ", like.device(), ", got ", tensor.sizes(), " ", tensor.scalar_type(),
              " on ", tensor.device());
}

/// Elements from one row of a 2-D matrix to the next where its columns are
/// contiguous (cols or more: a column range of a wider matrix); -1 otherwise.
inline int64_t row_stride(const at::Tensor& matrix) {
  if (matrix.size(1) > 1 && matrix.stride(1) != 1) return -1;
  if (matrix.size(0) <= 1) return matrix.size(1);
  return matrix.stride(0) >= matrix.size(1) ? matrix.stride(0) : -1;
}

/// Runs compute over `inputs` ([rows, cols] with contiguous rows, one dtype
/// of bf16, fp16 and fp32, on one CUDA device: contiguous matrices, or column
/// ranges of wider ones) and writes output o as the FP8 cast of
/// the compute's o-th values, as cast_transpose does for one input and the
/// identity (Float8Tensor says what each member holds; undefined amax and
/// inverse scales are allocated here, as is the scale of an output without
/// one). The outputs share one FP8 format (their dtype), one row stride of
/// their data (which, like the inputs, may be column ranges of a wider
/// matrix, so that two outputs can be the halves of one cast), and all have a
/// transpose or none, a scale or none, an amax or none. Runs on the current
/// stream of the inputs' device, without synchronising with the host. `what`
/// starts the error messages.
template <int kInputs, int kOutputs, typename Compute>
void launch_float8_tiles(const char* what, const at::Tensor (&inputs)[kInputs],
                         Float8Tensor* const (&outputs)[kOutputs], const Compute& compute) {
  const at::Tensor& first = inputs[0];
  const c10::ScalarType input_dtype = first.scalar_type();
  TORCH_CHECK(input_dtype == at::kBFloat16 || input_dtype == at::kHalf || input_dtype == at::kFloat, what,
              "inputs must be bf16, fp16 or fp32, got ", input_dtype);
  for (const at::Tensor& input : inputs) {
    TORCH_CHECK(input.is_cuda() && input.device() == first.device() && input.dim() == 2 &&
                    input.sizes() == first.sizes() && input.scalar_type() == input_dtype && row_stride(input) >= 0,
                what, "inputs must be 2-D ", input_dtype,
                " CUDA tensors of one shape and device with contiguous rows, got ", input.sizes(), " ",
                input.scalar_type(), " with strides ", input.strides(), " on ", input.device());
  }
  const int64_t rows = first.size(0);
  const int64_t cols = first.size(1);
  TORCH_CHECK(outputs[0]->data.defined() || outputs[0]->transposed.defined(), what,
              "data, transposed or both must be given");
  const at::Tensor& format_source = outputs[0]->data.defined() ? outputs[0]->data : outputs[0]->transposed;
  const c10::ScalarType float8_dtype = format_source.scalar_type();
  TORCH_CHECK(float8_dtype == at::kFloat8_e4m3fn || float8_dtype == at::kFloat8_e5m2, what,
              "outputs must be float8_e4m3fn or float8_e5m2, got ", float8_dtype);
  TileArgs<kInputs, kOutputs> args{};
  const int64_t vector = 16 / static_cast<int64_t>(first.element_size());
  args.vectorized = cols % vector == 0;
  for (int in = 0; in < kInputs; ++in) {
    args.inputs[in] = inputs[in].data_ptr();
    args.input_strides[in] = row_stride(inputs[in]);
    args.vectorized = args.vectorized && aligned(args.inputs[in], 16) && args.input_strides[in] % vector == 0;
  }
  args.rows_aligned = rows % 4 == 0;
  const auto fp32 = first.options().dtype(at::kFloat);
  // Output 0's, before the loop gives it a scale of its own.
  const bool with_scale = outputs[0]->scale.defined();
  // The outputs' data share one row stride: the first output with data sets it.
  const Float8Tensor* const* first_with_data =
      std::find_if(std::begin(outputs), std::end(outputs), [](const Float8Tensor* out) { return out->data.defined(); });
  const int64_t data_stride = first_with_data == std::end(outputs)  ? cols
                              : (*first_with_data)->data.dim() == 2 ? row_stride((*first_with_data)->data)
                                                                    : -1;  // refused below
  args.output_stride = data_stride;
  for (int o = 0; o < kOutputs; ++o) {
    Float8Tensor& out = *outputs[o];
    TORCH_CHECK(out.data.defined() || out.transposed.defined(), what, "data, transposed or both must be given");
    TORCH_CHECK(out.transposed.defined() == outputs[0]->transposed.defined() && out.scale.defined() == with_scale &&
                    out.amax.defined() == outputs[0]->amax.defined(),
                what, "the outputs of one launch must all have a transpose or none, a scale or none, an amax or none");
    TORCH_CHECK(out.scale.defined() || out.amax.defined(), what,
                "without a scale, the amax of the input must be given (current scaling)");
    if (out.data.defined()) {
      TORCH_CHECK(out.data.device() == first.device() && out.data.scalar_type() == float8_dtype &&
                      out.data.sizes() == first.sizes() && row_stride(out.data) >= 0 &&
                      row_stride(out.data) == data_stride,
                  what, "data must be ", first.sizes(), " ", float8_dtype, " on ", first.device(),
                  " with contiguous rows, one row stride for every output, got strides ", out.data.strides());
    }
    if (out.transposed.defined()) {
      TORCH_CHECK(out.transposed.device() == first.device() && out.transposed.scalar_type() == float8_dtype &&
                      out.transposed.dim() == 2 && out.transposed.size(0) == cols && out.transposed.size(1) == rows &&
                      out.transposed.is_contiguous(),
                  what, "transposed must be contiguous [", cols, ", ", rows, "] ", float8_dtype, " on ",
                  first.device());
    }
    const bool scale_from_amax = !out.scale.defined();
    if (out.amax.defined()) check_scalar(out.amax, first, what, scale_from_amax ? "amax of the input" : "amax");
    if (scale_from_amax) out.scale = at::empty({}, fp32);
    check_scalar(out.scale, first, what, "scale");
    if (!out.inverse_scale.defined()) out.inverse_scale = at::empty({}, fp32);
    check_scalar(out.inverse_scale, first, what, "inverse_scale");
    TileOutput& tile_output = args.outputs[o];
    tile_output.data = out.data.defined() ? static_cast<uint8_t*>(out.data.data_ptr()) : nullptr;
    tile_output.transposed = out.transposed.defined() ? static_cast<uint8_t*>(out.transposed.data_ptr()) : nullptr;
    tile_output.amax = !scale_from_amax && out.amax.defined() ? out.amax.data_ptr<float>() : nullptr;
    tile_output.scale = out.scale.data_ptr<float>();
    tile_output.inverse_scale = out.inverse_scale.data_ptr<float>();
    tile_output.scale_source = scale_from_amax ? out.amax.data_ptr<float>() : out.scale.data_ptr<float>();
    tile_output.scale_from_amax = scale_from_amax;
    args.vectorized = args.vectorized && aligned(tile_output.data, vector);
    args.rows_aligned = args.rows_aligned && aligned(tile_output.transposed, 4);
  }
  args.vectorized = args.vectorized && args.output_stride % vector == 0;
  args.largest = static_cast<float>(float8_largest(float8_dtype));
  args.rows = rows;
  args.cols = cols;

  const c10::cuda::CUDAGuard device_guard(first.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(first.get_device());
  args.col_tiles = std::max<int64_t>(1, (cols + kTile - 1) / kTile);
  const bool e4m3 = float8_dtype == at::kFloat8_e4m3fn;
  auto with_type = [&](auto type) {
    using T = decltype(type);
    // An empty input still takes one block, which writes the inverse scales.
    constexpr int kTileRows = tile_rows<T, kInputs>();
    const int64_t row_tiles = std::max<int64_t>(1, (rows + kTileRows - 1) / kTileRows);
    TORCH_CHECK(row_tiles * args.col_tiles <= INT32_MAX, what, "input of ", first.sizes(), " has too many tiles");
    const dim3 grid(static_cast<unsigned>(row_tiles * args.col_tiles));
    if (e4m3) {
      launch_with_format<T, kInputs, kOutputs, Compute, __NV_E4M3>(args, compute, grid, stream);
    } else {
      launch_with_format<T, kInputs, kOutputs, Compute, __NV_E5M2>(args, compute, grid, stream);
    }
  };
  switch (input_dtype) {
    case at::kBFloat16: with_type(__nv_bfloat16{}); break;
    case at::kHalf: with_type(__half{}); break;
    default: with_type(float{}); break;
  }
}

}  // namespace ddp::detail::float8_tiles
