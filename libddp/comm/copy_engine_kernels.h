#pragma once

// The one kernel of the copy-engine all-reduce (copy_engine_reduction.cpp),
// declared for host code: the copy engines move the bytes between GPUs, this
// kernel reduces what arrived.

#include <cstdint>

#include <cuda_runtime_api.h>

namespace ddp::detail {

enum class ChunkDtype { kFloat, kBFloat16, kHalf };
enum class ChunkOp { kSum, kMax };

constexpr int kMaxChunkSources = 8;

/// What reduce_chunk combines: `sources` chunks of `numel` elements, in rank
/// order, so that every rank would compute the same rounding.
struct ChunkReduction {
  const void* sources[kMaxChunkSources];
  int source_count = 0;
  void* outputs[2] = {nullptr, nullptr};  ///< The result goes to both (the second may be null).
  std::int64_t numel = 0;
  ChunkDtype dtype = ChunkDtype::kFloat;  ///< The sources'.
  /// The outputs': the sources' own, or kFloat from a 16-bit dtype (a
  /// reduce-scatter of bf16 gradients straight into an fp32 gradient shard).
  ChunkDtype output_dtype = ChunkDtype::kFloat;
  ChunkOp op = ChunkOp::kSum;
  float scale = 1.0f;  ///< Applied after a sum: 1 / world size for an average.
};

/// Queues the reduction on `stream`, computing in fp32.
void reduce_chunk(const ChunkReduction& reduction, cudaStream_t stream);

}  // namespace ddp::detail
