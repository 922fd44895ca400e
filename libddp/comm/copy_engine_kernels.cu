// The reduction of the copy-engine all-reduce: each rank sums (or takes the
// maximum of) its own chunk and the peers' copies of it that the copy engines
// delivered, and writes the result twice: into its tensor and into the
// staging area the peers pull it from. Bandwidth-bound, so 16-byte loads (and
// stores of the same elements) where every pointer allows them. A
// reduce-scatter of 16-bit gradients may write fp32: the sum is computed in
// fp32 anyway, and a separate cast would read and write the shard again.

#include <algorithm>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "comm/copy_engine_kernels.h"
#include "cuda/cuda_check.h"
#include "cuda/float_conversions.cuh"
#include "cuda/packs.cuh"

namespace ddp::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kVectorBytes = 16;

struct KernelArgs {
  const void* sources[kMaxChunkSources];
  void* outputs[2];
  int source_count;
  std::int64_t numel;
  float scale;
};

template <typename T, ChunkOp Op>
__device__ __forceinline__ float combine(float acc, T value) {
  const float x = to_float(value);
  return Op == ChunkOp::kSum ? acc + x : fmaxf(acc, x);
}

/// Reduces elements [begin, end) of every source one element at a time; `Pack`
/// elements at once when `Pack` > 1 (the caller checked the alignment).
template <typename T, typename Out, ChunkOp Op, int Pack>
__device__ void reduce_range(const KernelArgs& args, std::int64_t begin, std::int64_t end) {
  struct alignas(sizeof(T) * Pack) Vector {
    T value[Pack];
  };
  // The same elements in the outputs' dtype: one 16-byte store, or two.
  struct alignas(sizeof(Out) * Pack < kVectorBytes ? sizeof(Out) * Pack : kVectorBytes) OutVector {
    Out value[Pack];
  };
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x * Pack;
  for (std::int64_t i = begin + (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * Pack; i < end;
       i += stride) {
    float acc[Pack];
    const Vector first = *reinterpret_cast<const Vector*>(static_cast<const T*>(args.sources[0]) + i);
#pragma unroll
    for (int k = 0; k < Pack; ++k) acc[k] = to_float(first.value[k]);
    for (int s = 1; s < args.source_count; ++s) {
      const Vector next = *reinterpret_cast<const Vector*>(static_cast<const T*>(args.sources[s]) + i);
#pragma unroll
      for (int k = 0; k < Pack; ++k) acc[k] = combine<T, Op>(acc[k], next.value[k]);
    }
    OutVector out;
#pragma unroll
    for (int k = 0; k < Pack; ++k) out.value[k] = from_float<Out>(Op == ChunkOp::kSum ? acc[k] * args.scale : acc[k]);
    for (int o = 0; o < 2; ++o) {
      if (args.outputs[o] != nullptr) *reinterpret_cast<OutVector*>(static_cast<Out*>(args.outputs[o]) + i) = out;
    }
  }
}

template <typename T, typename Out, ChunkOp Op, bool Vectorized>
__global__ void __launch_bounds__(kThreads) reduce_chunk_kernel(KernelArgs args) {
  constexpr int kPack = kVectorBytes / sizeof(T);
  if constexpr (Vectorized) {
    const std::int64_t vectorized = args.numel / kPack * kPack;
    reduce_range<T, Out, Op, kPack>(args, 0, vectorized);
    reduce_range<T, Out, Op, 1>(args, vectorized, args.numel);  // the tail
  } else {
    reduce_range<T, Out, Op, 1>(args, 0, args.numel);
  }
}

template <typename T, typename Out, ChunkOp Op>
void launch(const ChunkReduction& r, cudaStream_t stream) {
  KernelArgs args{};
  bool vectorized = true;
  for (int s = 0; s < r.source_count; ++s) {
    args.sources[s] = r.sources[s];
    vectorized = vectorized && aligned(r.sources[s], kVectorBytes);
  }
  for (int o = 0; o < 2; ++o) {
    args.outputs[o] = r.outputs[o];
    vectorized = vectorized && (r.outputs[o] == nullptr || aligned(r.outputs[o], kVectorBytes));
  }
  args.source_count = r.source_count;
  args.numel = r.numel;
  args.scale = r.scale;
  // Enough blocks to fill the GPU a few times over at 16 bytes a thread, no
  // more: the grid-stride loop takes the rest, and a short kernel leaves the
  // SMs to the backward it runs beside sooner.
  const std::int64_t packs = (r.numel * static_cast<std::int64_t>(sizeof(T)) + kVectorBytes - 1) / kVectorBytes;
  const int blocks = static_cast<int>(std::min<std::int64_t>((packs + kThreads - 1) / kThreads, 1024));
  if (vectorized) {
    reduce_chunk_kernel<T, Out, Op, true><<<blocks, kThreads, 0, stream>>>(args);
  } else {
    reduce_chunk_kernel<T, Out, Op, false><<<blocks, kThreads, 0, stream>>>(args);
  }
  DDP_CUDA_CHECK_LAUNCH("reduce_chunk_kernel");
}

template <typename T, typename Out = T>
void launch_op(const ChunkReduction& r, cudaStream_t stream) {
  if (r.op == ChunkOp::kSum) {
    launch<T, Out, ChunkOp::kSum>(r, stream);
  } else {
    launch<T, Out, ChunkOp::kMax>(r, stream);
  }
}

/// A 16-bit dtype's sources, into outputs of their own dtype or fp32.
template <typename T>
void launch_16_bit(const ChunkReduction& r, cudaStream_t stream) {
  if (r.output_dtype == ChunkDtype::kFloat) {
    launch_op<T, float>(r, stream);
  } else {
    launch_op<T>(r, stream);
  }
}

}  // namespace

void reduce_chunk(const ChunkReduction& reduction, cudaStream_t stream) {
  if (reduction.numel == 0) return;
  switch (reduction.dtype) {
    case ChunkDtype::kFloat: launch_op<float>(reduction, stream); break;
    case ChunkDtype::kBFloat16: launch_16_bit<__nv_bfloat16>(reduction, stream); break;
    case ChunkDtype::kHalf: launch_16_bit<__half>(reduction, stream); break;
  }
}

}  // namespace ddp::detail
