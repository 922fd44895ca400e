#include "precision/float8_cast.h"

#include <algorithm>
#include <cstdint>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include "comm/cuda_check.h"

namespace ddp::detail {
namespace {

// One block casts a 64 x 64 tile: each thread loads 16 bytes of input at a
// time, and the tile is small enough (4 KiB of FP8) for several blocks per SM
// to keep enough loads in flight for a memory-bound kernel.
constexpr int kTile = 64;
constexpr int kThreads = 256;
// Row stride of the FP8 tile in shared memory, in 32-bit words: odd, so that
// the transposing reads (8 rows x 4 words per warp) hit 32 different banks.
constexpr int kTileStrideWords = kTile / 4 + 1;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

/// |x| as int bits: for non-negative floats (NaN included, after fabsf) the
/// integer order is the float order, so integer max and atomicMax give the
/// amax, NaN winning as in ATen's reductions.
__device__ __forceinline__ int abs_bits(float x) { return __float_as_int(fabsf(x)); }

/// Clamps to [-largest, largest] with comparisons, which keep a NaN (fminf
/// and fmaxf would replace it).
__device__ __forceinline__ float saturate(float x, float largest) {
  x = x > largest ? largest : x;
  return x < -largest ? -largest : x;
}

template <__nv_fp8_interpretation_t kFormat>
__device__ __forceinline__ uint32_t to_float8x4(float a, float b, float c, float d) {
  // Rounds to nearest even; SATFINITE maps overflow to the largest finite
  // value and keeps NaN. The first value lands in the lowest byte.
  const uint32_t low = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kFormat);
  const uint32_t high = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, kFormat);
  return low | (high << 16);
}

/// ATen's clamp_min: a NaN amax stays NaN (fmaxf would replace it).
__device__ __forceinline__ float at_least_min_amax(float amax) {
  return amax < kFloat8MinAmax ? kFloat8MinAmax : amax;
}

/// Casts one 64 x 64 tile of `input` ([rows, cols] row-major) to `out`, and
/// with kTransposed to `out_t` ([cols, rows] row-major) through shared memory,
/// so that both the reads and the writes of the transposed copy are
/// coalesced. With kAmax, max |input| is max-accumulated into *amax. The
/// scale is *scale_source, or largest / *scale_source if scale_from_amax;
/// the first block writes its inverse to *inverse_scale, if given.
/// vectorized: input, out and cols allow 16-byte loads and
/// (16 / sizeof(T))-byte stores; rows_aligned: rows and out_t allow 4-byte
/// stores of the transposed copy. Tiles at the edges check their bounds.
template <typename T, __nv_fp8_interpretation_t kFormat, bool kTransposed, bool kAmax>
__global__ void __launch_bounds__(kThreads)
    cast_to_float8_kernel(const T* __restrict__ input, const float* __restrict__ scale_source, bool scale_from_amax,
                          float largest, int64_t rows, int64_t cols, int64_t col_tiles, bool vectorized,
                          bool rows_aligned, uint8_t* __restrict__ out, uint8_t* __restrict__ out_t,
                          float* __restrict__ amax, float* __restrict__ inverse_scale) {
  constexpr int kVector = 16 / sizeof(T);  // elements per 16-byte load
  constexpr int kVectorsPerRow = kTile / kVector;
  constexpr int kRowsPerPass = kThreads / kVectorsPerRow;
  constexpr int kPasses = kTile / kRowsPerPass;  // rows of the tile each thread casts
  static_assert(kVector % 4 == 0 && kThreads % kVectorsPerRow == 0 && kTile % kRowsPerPass == 0);

  __shared__ uint32_t tile[kTile * kTileStrideWords];
  __shared__ int warp_amax[kThreads / 32];

  const int64_t row0 = static_cast<int64_t>(blockIdx.x) / col_tiles * kTile;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) % col_tiles * kTile;
  const float source = __ldg(scale_source);
  const float s = scale_from_amax ? largest / at_least_min_amax(source) : source;
  if (inverse_scale != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *inverse_scale = 1.0f / s;
  int max_bits = 0;

  const int tile_col = threadIdx.x % kVectorsPerRow * kVector;
  const int first_tile_row = threadIdx.x / kVectorsPerRow;
  const int64_t col = col0 + tile_col;
  if (col < cols) {
    const bool full = vectorized && col + kVector <= cols;
    // Every load of this thread first, so that they are in flight together:
    // a block moves only a few KiB, and waiting for one load at a time would
    // leave the memory system idle.
    alignas(16) T loaded[kPasses][kVector];
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int64_t row = row0 + first_tile_row + pass * kRowsPerPass;
      if (row >= rows) break;
      const int64_t offset = row * cols + col;
      if (full) {
        *reinterpret_cast<uint4*>(loaded[pass]) = __ldg(reinterpret_cast<const uint4*>(input + offset));
      } else {
        // Zeros past the edge: they leave the amax alone and are never stored.
#pragma unroll
        for (int i = 0; i < kVector; ++i) loaded[pass][i] = col + i < cols ? input[offset + i] : T(0.0f);
      }
    }
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int tile_row = first_tile_row + pass * kRowsPerPass;
      const int64_t row = row0 + tile_row;
      if (row >= rows) break;
      const int64_t offset = row * cols + col;
      const T* x = loaded[pass];
      uint32_t words[kVector / 4];
#pragma unroll
      for (int w = 0; w < kVector / 4; ++w) {
        float v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          v[i] = to_float(x[4 * w + i]);
          if constexpr (kAmax) max_bits = max(max_bits, abs_bits(v[i]));
          v[i] = saturate(v[i] * s, largest);
        }
        words[w] = to_float8x4<kFormat>(v[0], v[1], v[2], v[3]);
        if constexpr (kTransposed) tile[tile_row * kTileStrideWords + tile_col / 4 + w] = words[w];
      }
      if (out == nullptr) continue;
      if (full) {
        if constexpr (kVector == 8) {
          *reinterpret_cast<uint2*>(out + offset) = make_uint2(words[0], words[1]);
        } else {
          *reinterpret_cast<uint32_t*>(out + offset) = words[0];
        }
      } else {
#pragma unroll
        for (int i = 0; i < kVector; ++i) {
          if (col + i < cols) out[offset + i] = words[i / 4] >> (8 * (i % 4)) & 0xFF;
        }
      }
    }
  }

  if constexpr (kTransposed) {
    __syncthreads();
    // Each thread transposes a 4 x 4 block of bytes: 4 rows' words of the
    // same 4 columns become 4 words of 4 rows each, one per column. A warp
    // covers 8 blocks down (32 bytes of each output row) and 4 across.
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    const int block_row = lane % 8 + 8 * (warp % 2);  // in 4-row units
    const int block_col = lane / 8 + 4 * (warp / 2);  // in 4-column units
    uint32_t in[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) in[r] = tile[(4 * block_row + r) * kTileStrideWords + block_col];
    const uint32_t lo01 = __byte_perm(in[0], in[1], 0x5140);  // bytes 0 and 1 of rows 0 and 1, interleaved
    const uint32_t hi01 = __byte_perm(in[0], in[1], 0x7362);  // bytes 2 and 3
    const uint32_t lo23 = __byte_perm(in[2], in[3], 0x5140);
    const uint32_t hi23 = __byte_perm(in[2], in[3], 0x7362);
    const uint32_t columns[4] = {__byte_perm(lo01, lo23, 0x5410), __byte_perm(lo01, lo23, 0x7632),
                                 __byte_perm(hi01, hi23, 0x5410), __byte_perm(hi01, hi23, 0x7632)};
    const int64_t row = row0 + 4 * block_row;
    if (row < rows) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t out_row = col0 + 4 * block_col + c;
        if (out_row >= cols) break;
        uint8_t* destination = out_t + out_row * rows + row;
        if (rows_aligned) {
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

  if constexpr (kAmax) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      max_bits = max(max_bits, __shfl_xor_sync(0xffffffffu, max_bits, offset));
    }
    if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = max_bits;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kThreads / 32; ++w) max_bits = max(max_bits, warp_amax[w]);
      atomicMax(reinterpret_cast<int*>(amax), max_bits);
    }
  }
}

struct Launch {
  dim3 grid;
  cudaStream_t stream;
  const void* input;
  const float* scale_source;
  bool scale_from_amax;
  float largest;
  int64_t rows, cols, col_tiles;
  bool vectorized, rows_aligned;
  uint8_t* out;
  uint8_t* out_t;
  float* amax;
  float* inverse_scale;
};

template <typename T, __nv_fp8_interpretation_t kFormat, bool kTransposed, bool kAmax>
void launch(const Launch& l) {
  cast_to_float8_kernel<T, kFormat, kTransposed, kAmax>
      <<<l.grid, kThreads, 0, l.stream>>>(static_cast<const T*>(l.input), l.scale_source, l.scale_from_amax,
                                          l.largest, l.rows, l.cols, l.col_tiles, l.vectorized, l.rows_aligned,
                                          l.out, l.out_t, l.amax, l.inverse_scale);
  check_cuda(cudaGetLastError(), "cast_to_float8_kernel<<<...>>>");
}

template <typename T, __nv_fp8_interpretation_t kFormat>
void launch(const Launch& l) {
  const bool transposed = l.out_t != nullptr;
  const bool amax = l.amax != nullptr;
  if (transposed && amax) {
    launch<T, kFormat, true, true>(l);
  } else if (transposed) {
    launch<T, kFormat, true, false>(l);
  } else if (amax) {
    launch<T, kFormat, false, true>(l);
  } else {
    launch<T, kFormat, false, false>(l);
  }
}

template <typename T>
void launch(const Launch& l, c10::ScalarType float8_dtype) {
  if (float8_dtype == at::kFloat8_e4m3fn) {
    launch<T, __NV_E4M3>(l);
  } else {
    launch<T, __NV_E5M2>(l);
  }
}

bool aligned(const void* pointer, std::uintptr_t bytes) {
  return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0;
}

constexpr int kHistoryThreads = 256;
// Histories per launch: their pointers travel as a kernel parameter, which
// stays within the 4 KiB every CUDA version accepts.
constexpr int kHistoriesPerLaunch = 64;

struct HistoryPointers {
  float* history;
  float* amax;  // null: only the scale is recomputed
  float* scale;
  int64_t length;
  float target;
  bool use_max;
};

struct HistoryBatch {
  HistoryPointers histories[kHistoriesPerLaunch];
};
static_assert(sizeof(HistoryBatch) + sizeof(float*) <= 4096, "the kernel parameters must fit in 4 KiB");

/// See update_amax_histories: block b updates history b of the batch, with
/// entered[b] (if given) as its newest amax.
__global__ void __launch_bounds__(kHistoryThreads)
    update_amax_histories_kernel(const HistoryBatch batch, const float* __restrict__ entered) {
  const HistoryPointers h = batch.histories[blockIdx.x];
  float* const history = h.history;
  const bool shift = h.amax != nullptr || entered != nullptr;
  __shared__ float newest;
  __shared__ int warp_max[kHistoryThreads / 32];
  if (threadIdx.x == 0 && shift) {
    newest = entered != nullptr ? entered[blockIdx.x] : *h.amax;
    if (h.amax != nullptr) *h.amax = 0.0f;
  }
  __syncthreads();

  // The shift goes from the last chunk to the first: a chunk reads the
  // entries one below its own before any of them is overwritten, and the
  // barrier keeps a chunk's reads ahead of its writes.
  int max_bits = 0;
  const int64_t last_chunk = (h.length - 1) / kHistoryThreads * kHistoryThreads;
  for (int64_t chunk = last_chunk; chunk >= 0; chunk -= kHistoryThreads) {
    const int64_t i = chunk + threadIdx.x;
    float value = 0.0f;
    if (i < h.length) value = !shift ? history[i] : (i == 0 ? newest : history[i - 1]);
    __syncthreads();
    if (i < h.length) {
      if (shift) history[i] = value;
      max_bits = max(max_bits, abs_bits(value));
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    max_bits = max(max_bits, __shfl_xor_sync(0xffffffffu, max_bits, offset));
  }
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = max_bits;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kHistoryThreads / 32; ++w) max_bits = max(max_bits, warp_max[w]);
    // The history holds amaxes (>= 0 or NaN), so the bits' maximum is theirs.
    const float history_amax = h.use_max ? __int_as_float(max_bits) : (shift ? newest : history[0]);
    if (isfinite(history_amax) && history_amax > 0.0f) *h.scale = h.target / at_least_min_amax(history_amax);
  }
}

void check_scalar(const at::Tensor& tensor, const at::Tensor& input, const char* function, const char* name) {
  TORCH_CHECK(tensor.device() == input.device() && tensor.dim() == 0 && tensor.scalar_type() == at::kFloat, function,
              name, " must be a 0-dim fp32 tensor on ", input.device(), ", got ", tensor.sizes(), " ",
              tensor.scalar_type(), " on ", tensor.device());
}

}  // namespace

void update_amax_histories(const std::vector<AmaxHistoryUpdate>& updates, const at::Tensor& entered) {
  const char* const what = "update_amax_histories: ";
  if (updates.empty()) return;
  const at::Tensor& first = updates.front().history;
  for (const AmaxHistoryUpdate& update : updates) {
    const at::Tensor& history = update.history;
    TORCH_CHECK(history.is_cuda() && history.device() == first.device() && history.dim() == 1 && history.numel() > 0 &&
                    history.is_contiguous() && history.scalar_type() == at::kFloat,
                what, "every history must be a non-empty contiguous 1-D fp32 tensor on ", first.device(), ", got ",
                history.sizes(), " ", history.scalar_type(), " on ", history.device());
    check_scalar(update.scale, history, what, "scale");
    if (update.amax.defined()) check_scalar(update.amax, history, what, "amax");
  }
  const int64_t count = static_cast<int64_t>(updates.size());
  if (entered.defined()) {
    TORCH_CHECK(entered.device() == first.device() && entered.dim() == 1 && entered.numel() == count &&
                    entered.is_contiguous() && entered.scalar_type() == at::kFloat,
                what, "entered must be a contiguous [", count, "] fp32 tensor on ", first.device(), ", got ",
                entered.sizes(), " ", entered.scalar_type(), " on ", entered.device());
  }
  const c10::cuda::CUDAGuard device_guard(first.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(first.get_device());
  for (int64_t start = 0; start < count; start += kHistoriesPerLaunch) {
    const int64_t blocks = std::min<int64_t>(kHistoriesPerLaunch, count - start);
    HistoryBatch batch{};
    for (int64_t b = 0; b < blocks; ++b) {
      const AmaxHistoryUpdate& update = updates[start + b];
      batch.histories[b] = {update.history.data_ptr<float>(),
                            update.amax.defined() ? update.amax.data_ptr<float>() : nullptr,
                            update.scale.data_ptr<float>(), update.history.numel(), update.target, update.use_max};
    }
    update_amax_histories_kernel<<<static_cast<unsigned>(blocks), kHistoryThreads, 0, stream>>>(
        batch, entered.defined() ? entered.data_ptr<float>() + start : nullptr);
    check_cuda(cudaGetLastError(), "update_amax_histories_kernel<<<...>>>");
  }
}

void cast_to_float8(const at::Tensor& input, const Float8CastScale& scale, float largest,
                    const Float8CastOutputs& outputs) {
  const char* const what = "cast_to_float8: ";
  TORCH_CHECK(input.is_cuda() && input.dim() == 2 && input.is_contiguous(), what,
              "input must be a contiguous 2-D CUDA tensor, got ", input.sizes(), " on ", input.device());
  const c10::ScalarType input_dtype = input.scalar_type();
  TORCH_CHECK(input_dtype == at::kBFloat16 || input_dtype == at::kHalf || input_dtype == at::kFloat, what,
              "input must be bf16, fp16 or fp32, got ", input_dtype);
  check_scalar(scale.value, input, what, scale.from_amax ? "amax of the input" : "scale");
  const int64_t rows = input.size(0);
  const int64_t cols = input.size(1);
  const at::Tensor& out = outputs.data;
  const at::Tensor& out_t = outputs.transposed;
  TORCH_CHECK(out.defined() || out_t.defined(), what, "data, transposed or both must be given");
  const c10::ScalarType float8_dtype = (out.defined() ? out : out_t).scalar_type();
  TORCH_CHECK(float8_dtype == at::kFloat8_e4m3fn || float8_dtype == at::kFloat8_e5m2, what,
              "data must be float8_e4m3fn or float8_e5m2, got ", float8_dtype);
  if (out.defined()) {
    TORCH_CHECK(out.device() == input.device() && out.sizes() == input.sizes() && out.is_contiguous(), what,
                "data must be contiguous ", input.sizes(), " on ", input.device());
  }
  if (out_t.defined()) {
    TORCH_CHECK(out_t.device() == input.device() && out_t.scalar_type() == float8_dtype && out_t.dim() == 2 &&
                    out_t.size(0) == cols && out_t.size(1) == rows && out_t.is_contiguous(),
                what, "transposed must be contiguous [", cols, ", ", rows, "] ", float8_dtype, " on ", input.device());
  }
  const at::Tensor& amax = outputs.amax;
  if (amax.defined()) check_scalar(amax, input, what, "amax");
  const at::Tensor& inverse_scale = outputs.inverse_scale;
  if (inverse_scale.defined()) check_scalar(inverse_scale, input, what, "inverse_scale");

  const c10::cuda::CUDAGuard device_guard(input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(input.get_device());
  // An empty input still takes one block, which writes the inverse scale.
  const int64_t row_tiles = std::max<int64_t>(1, (rows + kTile - 1) / kTile);
  const int64_t col_tiles = std::max<int64_t>(1, (cols + kTile - 1) / kTile);
  TORCH_CHECK(row_tiles * col_tiles <= INT32_MAX, what, "input of ", input.sizes(), " has too many tiles");
  Launch l{};
  l.grid = dim3(static_cast<unsigned>(row_tiles * col_tiles));
  l.stream = stream;
  l.input = input.data_ptr();
  l.scale_source = scale.value.data_ptr<float>();
  l.scale_from_amax = scale.from_amax;
  l.largest = largest;
  l.rows = rows;
  l.cols = cols;
  l.col_tiles = col_tiles;
  const int64_t vector = 16 / static_cast<int64_t>(input.element_size());
  l.out = out.defined() ? static_cast<uint8_t*>(out.data_ptr()) : nullptr;
  l.vectorized = cols % vector == 0 && aligned(l.input, 16) && aligned(l.out, vector);
  l.out_t = out_t.defined() ? static_cast<uint8_t*>(out_t.data_ptr()) : nullptr;
  l.rows_aligned = rows % 4 == 0 && (l.out_t == nullptr || aligned(l.out_t, 4));
  l.amax = amax.defined() ? amax.data_ptr<float>() : nullptr;
  l.inverse_scale = inverse_scale.defined() ? inverse_scale.data_ptr<float>() : nullptr;
  switch (input_dtype) {
    case at::kBFloat16:
      launch<__nv_bfloat16>(l, float8_dtype);
      break;
    case at::kHalf:
      launch<__half>(l, float8_dtype);
      break;
    default:
      launch<float>(l, float8_dtype);
      break;
  }
}

}  // namespace ddp::detail
