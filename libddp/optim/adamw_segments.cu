// AdamW over runs of fp32 parameters in one launch: see adamw_segments.h for why.

#include "optim/adamw_segments.h"

#include <algorithm>
#include <cstring>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda/cuda_check.h"
#include "cuda/packs.cuh"

namespace ddp::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kPack = 4;  // fp32 elements per 16-byte load
constexpr std::int64_t kChunkElements = kThreads * kPack * 16;

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

__global__ void __launch_bounds__(kThreads)
    adamw_segments_kernel(const AdamWSegment* segments, int segment_count, AdamWHyper hyper) {
  if (hyper.found_inf != nullptr && *hyper.found_inf == 1.0f) return;
  const AdamWSegment& s = segments[segment_of(segments, segment_count, blockIdx.x)];
  const float step = *s.step;
  const float lr = hyper.lr != nullptr ? *hyper.lr : hyper.lr_value;
  const Corrections c{lr, 1 - powf(hyper.beta1, step), sqrtf(1 - powf(hyper.beta2, step))};
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

}  // namespace

void adamw_segments_step(std::vector<AdamWSegment> segments, const AdamWHyper& hyper, c10::Device device) {
  std::int64_t chunks = 0;
  for (auto& segment : segments) {
    segment.first_chunk = chunks;
    chunks += (segment.numel + kChunkElements - 1) / kChunkElements;
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
  adamw_segments_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(table_on_device, count, hyper);
  DDP_CUDA_CHECK_LAUNCH("adamw_segments_kernel");
}

}  // namespace ddp::detail
