// AdamW over runs of fp32 parameters in one launch: see adamw_segments.h for why.

#include "optim/adamw_segments.h"

#include <algorithm>
#include <cstring>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda/cuda_check.h"
#include "cuda/float8_bytes.cuh"
#include "cuda/packs.cuh"
#include "cuda/warp_reduce.cuh"

namespace ddp::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kPack = 4;  // fp32 elements per 16-byte load
constexpr std::int64_t kChunkElements = kThreads * kPack * 16;
// A segment that writes its FP8 cast updates a tile of 64 x 64 per block: 16
// threads of one 16-byte load across a row, 16 rows a pass, 4 passes.
constexpr int kTile = 64;
constexpr int kTileRowsPerPass = kThreads / (kTile / kPack);
constexpr int kTilePasses = kTile / kTileRowsPerPass;
// Row stride of the FP8 tile in shared memory, in 32-bit words: odd, so that
// the transposing reads (8 rows x 4 words per warp) hit 32 different banks.
constexpr int kTileStrideWords = kTile / 4 + 1;

std::int64_t chunks_of(const AdamWSegment& s) {
  const Float8WeightCast& cast = s.cast.float8;
  if (cast.data == nullptr) return (s.numel + kChunkElements - 1) / kChunkElements;
  return ((cast.rows + kTile - 1) / kTile) * ((cast.cols + kTile - 1) / kTile);
}

struct Corrections {
  float lr, bias_correction1, bias_correction2_sqrt;
};

/// The step of one element: ATen's fused AdamW
/// (fused_adam_utils.cuh, ADAM_MODE::ADAMW), operation for operation, so that
/// this step equals the fused optimizer's on the same gradient bit for bit.
__device__ __forceinline__ void adamw(float grad, float& param, float& exp_avg, float& exp_avg_sq, const AdamWHyper& h,
                                      const Corrections& c) {
  if (h.weight_decay != 0) param -= c.lr * h.weight_decay * param;
  exp_avg = fmaf(h.beta1, exp_avg, fmaf(-h.beta1, grad, grad));
  exp_avg_sq = fmaf(h.beta2, exp_avg_sq, fmaf(-h.beta2, grad * grad, grad * grad));
  const float step_size = c.lr / c.bias_correction1;
  const float denom = (sqrtf(exp_avg_sq) / c.bias_correction2_sqrt) + h.eps;
  param -= step_size * exp_avg / denom;
}

/// Elements [begin, end) of `s`, `Pack` consecutive ones per thread at a time
/// with one load per array when `Pack` > 1 (the caller checked the alignment).
template <int Pack>
__device__ void update_range(const AdamWSegment& s, const AdamWHyper& h, const Corrections& c, std::int64_t begin,
                             std::int64_t end) {
  struct alignas(sizeof(float) * Pack) Floats {
    float v[Pack];
  };
  for (std::int64_t e = begin + static_cast<std::int64_t>(threadIdx.x) * Pack; e < end;
       e += static_cast<std::int64_t>(blockDim.x) * Pack) {
    const Floats grad = *reinterpret_cast<const Floats*>(s.grad + e);
    Floats param = *reinterpret_cast<const Floats*>(s.param + e);
    Floats exp_avg = *reinterpret_cast<const Floats*>(s.exp_avg + e);
    Floats exp_avg_sq = *reinterpret_cast<const Floats*>(s.exp_avg_sq + e);
#pragma unroll
    for (int k = 0; k < Pack; ++k) adamw(grad.v[k], param.v[k], exp_avg.v[k], exp_avg_sq.v[k], h, c);
    *reinterpret_cast<Floats*>(s.param + e) = param;
    *reinterpret_cast<Floats*>(s.exp_avg + e) = exp_avg;
    *reinterpret_cast<Floats*>(s.exp_avg_sq + e) = exp_avg_sq;
    if (s.cast.bfloat16 != nullptr) {
      ::ddp::detail::Pack<__nv_bfloat16, Pack> copy;
#pragma unroll
      for (int k = 0; k < Pack; ++k) copy.v[k] = __float2bfloat16_rn(param.v[k]);
      *reinterpret_cast<::ddp::detail::Pack<__nv_bfloat16, Pack>*>(static_cast<__nv_bfloat16*>(s.cast.bfloat16) + e) =
          copy;
    }
  }
}

/// Tile `tile` of `s`, a [rows, cols] weight, updated, and written as E4M3
/// with the scale *cast.scale: row-major, and transposed through shared
/// memory so that both its reads and its writes are coalesced; max |w| goes
/// to *cast.amax. The bytes float8::cast_transpose writes for the updated
/// weight (the same product, rounding and saturation). `skip` (a found inf):
/// the weight stays, and the cast is of it as it is, which the next forward
/// would cast.
__device__ void update_tile_and_cast(const AdamWSegment& s, const AdamWHyper& h, const Corrections& c,
                                     std::int64_t tile, bool skip) {
  struct alignas(16) Floats {
    float v[kPack];
  };
  __shared__ std::uint32_t fp8[kTile * kTileStrideWords];
  __shared__ int warp_amax[kThreads / 32];
  const Float8WeightCast& w = s.cast.float8;
  const std::int64_t col_tiles = (w.cols + kTile - 1) / kTile;
  const std::int64_t row0 = tile / col_tiles * kTile;
  const std::int64_t col0 = tile % col_tiles * kTile;
  const float scale = *w.scale;
  if (tile == 0 && threadIdx.x == 0) *w.inverse_scale = 1.0f / scale;

  const int tile_col = static_cast<int>(threadIdx.x) % (kTile / kPack) * kPack;
  const int first_tile_row = static_cast<int>(threadIdx.x) / (kTile / kPack);
  const std::int64_t col = col0 + tile_col;
  int max_bits = 0;
  if (col < w.cols) {
    // Every load first, so that they are in flight together.
    Floats grad[kTilePasses], param[kTilePasses], exp_avg[kTilePasses], exp_avg_sq[kTilePasses];
#pragma unroll
    for (int pass = 0; pass < kTilePasses; ++pass) {
      const std::int64_t row = row0 + first_tile_row + pass * kTileRowsPerPass;
      if (row >= w.rows) break;
      const std::int64_t e = row * w.cols + col;
      grad[pass] = *reinterpret_cast<const Floats*>(s.grad + e);
      param[pass] = *reinterpret_cast<const Floats*>(s.param + e);
      exp_avg[pass] = *reinterpret_cast<const Floats*>(s.exp_avg + e);
      exp_avg_sq[pass] = *reinterpret_cast<const Floats*>(s.exp_avg_sq + e);
    }
#pragma unroll
    for (int pass = 0; pass < kTilePasses; ++pass) {
      const int tile_row = first_tile_row + pass * kTileRowsPerPass;
      const std::int64_t row = row0 + tile_row;
      if (row >= w.rows) break;
      const std::int64_t e = row * w.cols + col;
      if (!skip) {
#pragma unroll
        for (int k = 0; k < kPack; ++k) {
          adamw(grad[pass].v[k], param[pass].v[k], exp_avg[pass].v[k], exp_avg_sq[pass].v[k], h, c);
        }
        *reinterpret_cast<Floats*>(s.param + e) = param[pass];
        *reinterpret_cast<Floats*>(s.exp_avg + e) = exp_avg[pass];
        *reinterpret_cast<Floats*>(s.exp_avg_sq + e) = exp_avg_sq[pass];
      }
#pragma unroll
      for (int k = 0; k < kPack; ++k) max_bits = max(max_bits, abs_bits(param[pass].v[k]));
      const float* p = param[pass].v;
      const std::uint32_t word = to_float8x4<__NV_E4M3>(p[0] * scale, p[1] * scale, p[2] * scale, p[3] * scale);
      *reinterpret_cast<std::uint32_t*>(w.data + e) = word;
      fp8[tile_row * kTileStrideWords + tile_col / 4] = word;
    }
  }
  __syncthreads();
  // Each thread transposes one 4 x 4 block of bytes: a warp covers 8 blocks
  // down and 4 across, the block's 8 warps the 16 x 16 blocks of the tile.
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int block_col = lane / 8 + 4 * (warp / 2);  // in 4-column units
  const int block_row = lane % 8 + 8 * (warp % 2);  // in 4-row units
  const std::int64_t row = row0 + 4 * block_row;
  if (row < w.rows) {
    std::uint32_t rows_in[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) rows_in[r] = fp8[(4 * block_row + r) * kTileStrideWords + block_col];
    std::uint32_t columns[4];
    transpose_4x4_bytes(rows_in, columns);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const std::int64_t out_row = col0 + 4 * block_col + k;
      if (out_row >= w.cols) break;
      *reinterpret_cast<std::uint32_t*>(w.transposed + out_row * w.rows + row) = columns[k];
    }
  }
  max_bits = warp_max(max_bits);
  if (lane == 0) warp_amax[warp] = max_bits;
  __syncthreads();
  if (threadIdx.x == 0) {
    int bits = warp_amax[0];
    for (int i = 1; i < kThreads / 32; ++i) bits = max(bits, warp_amax[i]);
    atomicMax(reinterpret_cast<int*>(w.amax), bits);
  }
}

/// The segment block `chunk` works in: the last whose first chunk is at or
/// before it (segments in order of their first chunks).
__device__ int segment_of(const AdamWSegment* segments, int count, std::int64_t chunk) {
  int low = 0, high = count - 1;
  while (low < high) {
    const int middle = (low + high + 1) / 2;
    if (segments[middle].first_chunk <= chunk) {
      low = middle;
    } else {
      high = middle - 1;
    }
  }
  return low;
}

/// kCast: every segment writes its FP8 cast, and a chunk is a tile. A
/// launch of its own: the tiles' loads in flight take registers that would
/// cost the plain segments' blocks their occupancy.
template <bool kCast>
__global__ void __launch_bounds__(kThreads)
    adamw_segments_kernel(const AdamWSegment* segments, int segment_count, AdamWHyper hyper) {
  const bool skip = hyper.found_inf != nullptr && *hyper.found_inf == 1.0f;
  if (skip && !kCast) return;
  const AdamWSegment& s = segments[segment_of(segments, segment_count, blockIdx.x)];
  const float step = *s.step;
  const float lr = hyper.lr != nullptr ? *hyper.lr : hyper.lr_value;
  const Corrections c{lr, 1 - powf(hyper.beta1, step), sqrtf(1 - powf(hyper.beta2, step))};
  if constexpr (kCast) {
    update_tile_and_cast(s, hyper, c, blockIdx.x - s.first_chunk, skip);
    return;
  }
  const std::int64_t begin = (blockIdx.x - s.first_chunk) * kChunkElements;
  const std::int64_t end = min(begin + kChunkElements, s.numel);
  // Chunks begin at multiples of kPack: a segment whose arrays all start
  // on their vector's boundary takes the vector loads up to its tail.
  const bool vectorized =
      aligned(s.param, 16) && aligned(s.exp_avg, 16) && aligned(s.exp_avg_sq, 16) && aligned(s.grad, 16);
  std::int64_t scalar_from = begin;
  if (vectorized) {
    scalar_from = begin + (end - begin) / kPack * kPack;
    update_range<kPack>(s, hyper, c, begin, scalar_from);
  }
  update_range<1>(s, hyper, c, scalar_from, end);
}

/// Part of the segment table as a kernel argument (under CUDA's 4 KiB limit).
struct TableSlice {
  static constexpr int kBytes = 3968;
  unsigned char bytes[kBytes];
};

__global__ void write_table_slice(const TableSlice slice, unsigned char* destination, int bytes) {
  for (int i = threadIdx.x; i < bytes; i += blockDim.x) destination[i] = slice.bytes[i];
}

/// Queues adamw_segments_kernel<kCast> over `segments`.
template <bool kCast>
void launch_segments(std::vector<AdamWSegment>& segments, const AdamWHyper& hyper, c10::Device device) {
  std::int64_t chunks = 0;
  for (auto& segment : segments) {
    segment.first_chunk = chunks;
    chunks += chunks_of(segment);
  }
  if (chunks == 0) return;
  TORCH_CHECK(chunks <= INT32_MAX, "ddp::optim: too many elements for one AdamW launch (", chunks, " chunks)");
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  // The table reaches the device as kernel arguments, in the stream's order:
  // no host buffer that a later step could overwrite before its copy ran, and
  // a recorded step keeps the values in its graph.
  const std::size_t bytes = segments.size() * sizeof(AdamWSegment);
  const at::Tensor table = at::empty({static_cast<std::int64_t>(bytes)}, at::TensorOptions(device).dtype(at::kByte));
  auto* destination = static_cast<unsigned char*>(table.data_ptr());
  const auto* source = reinterpret_cast<const unsigned char*>(segments.data());
  for (std::size_t offset = 0; offset < bytes; offset += TableSlice::kBytes) {
    TableSlice slice;
    const int slice_bytes = static_cast<int>(std::min<std::size_t>(TableSlice::kBytes, bytes - offset));
    std::memcpy(slice.bytes, source + offset, slice_bytes);
    write_table_slice<<<1, kThreads, 0, stream>>>(slice, destination + offset, slice_bytes);
    DDP_CUDA_CHECK_LAUNCH("write_table_slice");
  }
  const auto* table_on_device = reinterpret_cast<const AdamWSegment*>(destination);
  const int count = static_cast<int>(segments.size());
  adamw_segments_kernel<kCast><<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(table_on_device, count, hyper);
  DDP_CUDA_CHECK_LAUNCH("adamw_segments_kernel");
}

}  // namespace

void adamw_segments_step(std::vector<AdamWSegment> segments, const AdamWHyper& hyper, c10::Device device) {
  std::vector<AdamWSegment> casting;
  std::vector<AdamWSegment> plain;
  for (const AdamWSegment& segment : segments) {
    (segment.cast.float8.data != nullptr ? casting : plain).push_back(segment);
  }
  launch_segments<false>(plain, hyper, device);
  launch_segments<true>(casting, hyper, device);
}

}  // namespace ddp::detail
