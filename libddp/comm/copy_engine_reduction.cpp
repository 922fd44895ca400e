// The copy-engine all-reduce: see copy_engine_reduction.h for why and how.

#include "comm/copy_engine_reduction.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <ddp/errors.h>

#include "comm/copy_engine_kernels.h"
#include "cuda/cuda_check.h"
#include "cuda/stream_capture.h"

namespace ddp::detail {
namespace {

// Each slot holds one rank's copy of a chunk: 16 MiB, so that a 25 MiB DDP
// bucket is one piece on two GPUs. The staging area of a rank is its counters
// and world_size + 1 such slots (48 MiB on two GPUs).
constexpr std::int64_t kSlotBytes = 16 << 20;
constexpr std::int64_t kCounterBytes = 4096;
// Chunks start on 256-byte boundaries, so that the kernel's 16-byte loads
// and the copies stay aligned wherever the tensor itself is.
constexpr std::int64_t kChunkAlignBytes = 256;
// What release_waits() writes into every counter: larger than any piece
// number, so that every wait (counter >= value, compared cyclically) passes.
constexpr std::uint32_t kReleased = 0x7fffffff;

// Stream memory operations live in the driver API; the runtime hands out
// their entry points, so libddp needs no link to libcuda.
using StreamValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

struct StreamMemoryOps {
  StreamValue32 wait = nullptr;
  StreamValue32 write = nullptr;
};

StreamValue32 driver_entry(const char* name) {
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  DDP_CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &entry, 12000, cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || entry == nullptr) {
    throw Error(
        fmt::format("libddp: the CUDA driver has no {}, which copy-engine reductions need; turn them off "
                    "(DDP_COPY_ENGINE_REDUCTIONS=0)",
                    name));
  }
  return reinterpret_cast<StreamValue32>(entry);
}

const StreamMemoryOps& stream_memory_ops() {
  static const StreamMemoryOps ops{driver_entry("cuStreamWaitValue32"), driver_entry("cuStreamWriteValue32")};
  return ops;
}

void check_driver(CUresult result, const char* call) {
  if (result != CUDA_SUCCESS) {
    throw std::runtime_error(fmt::format("{} failed: CUresult {}", call, static_cast<int>(result)));
  }
}

/// Queues on `stream` a wait until `*counter` >= `value`.
void wait_for(cudaStream_t stream, const std::uint32_t* counter, std::uint32_t value) {
  check_driver(
      stream_memory_ops().wait(stream, reinterpret_cast<CUdeviceptr>(counter), value, CU_STREAM_WAIT_VALUE_GEQ),
      "cuStreamWaitValue32");
}

/// Queues on `stream` the store of `value` into `*counter` (here or on a peer),
/// after everything queued before it is visible: the write fences.
void signal(cudaStream_t stream, std::uint32_t* counter, std::uint32_t value) {
  check_driver(
      stream_memory_ops().write(stream, reinterpret_cast<CUdeviceptr>(counter), value, CU_STREAM_WRITE_VALUE_DEFAULT),
      "cuStreamWriteValue32");
}

ChunkDtype chunk_dtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16: return ChunkDtype::kBFloat16;
    case at::kHalf: return ChunkDtype::kHalf;
    default: return ChunkDtype::kFloat;
  }
}

/// What every rank publishes in the store: its staging area and its GPU.
struct Announcement {
  cudaIpcMemHandle_t handle;
  int device_index;
};

template <typename T>
std::vector<std::uint8_t> bytes_of(const T& value) {
  const auto* first = reinterpret_cast<const std::uint8_t*>(&value);
  return {first, first + sizeof(T)};
}

template <typename T>
T from_bytes(const std::vector<std::uint8_t>& bytes, const std::string& key) {
  if (bytes.size() != sizeof(T)) {
    throw Error(fmt::format("libddp: malformed record '{}' in the store ({} bytes instead of {})", key, bytes.size(),
                            sizeof(T)));
  }
  T value;
  std::memcpy(&value, bytes.data(), sizeof(T));
  return value;
}

}  // namespace

CopyEngineReduction::CopyEngineReduction(c10d::Store& store, const std::string& key, int rank, int world_size,
                                         int device_index, std::chrono::milliseconds timeout)
    : rank_(rank), world_size_(world_size), device_index_(device_index), bases_(world_size, nullptr) {
  if (world_size < 2 || world_size > kMaxChunkSources) {
    throw UsageError(
        fmt::format("copy-engine reductions take 2 to {} GPUs of one node, not {}; turn them off "
                    "(DDP_COPY_ENGINE_REDUCTIONS=0)",
                    kMaxChunkSources, world_size));
  }
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  stream_memory_ops();  // fails here, at setup, if the driver lacks them
  slot_bytes_ = kSlotBytes;
  char* own = nullptr;
  DDP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&own), kCounterBytes + (world_size + 1) * slot_bytes_));
  bases_[rank] = own;
  DDP_CUDA_CHECK(cudaMemset(own, 0, kCounterBytes));
  DDP_CUDA_CHECK(cudaDeviceSynchronize());  // the counters are zero before any peer can see them
  DDP_CUDA_CHECK(cudaStreamCreateWithFlags(&release_stream_, cudaStreamNonBlocking));
  DDP_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&release_values_), kCounterBytes));
  std::fill(release_values_, release_values_ + kCounterBytes / sizeof(std::uint32_t), kReleased);

  Announcement mine{};
  DDP_CUDA_CHECK(cudaIpcGetMemHandle(&mine.handle, own));
  mine.device_index = device_index;
  store.set(fmt::format("{}/area/{}", key, rank), bytes_of(mine));
  std::vector<Announcement> peers(world_size);
  std::string unreachable;
  for (int peer = 0; peer < world_size; ++peer) {
    if (peer == rank) continue;
    const std::string peer_key = fmt::format("{}/area/{}", key, peer);
    store.wait({peer_key}, timeout);
    peers[peer] = from_bytes<Announcement>(store.get(peer_key), peer_key);
    int can_access = 0;
    DDP_CUDA_CHECK(cudaDeviceCanAccessPeer(&can_access, device_index, peers[peer].device_index));
    if (!can_access || peers[peer].device_index == device_index) {
      unreachable += fmt::format(" cuda:{} (rank {})", peers[peer].device_index, peer);
    }
  }
  // Every rank learns whether every rank can reach its peers, so that all
  // take the copy engines or all fail here, rather than some waiting forever.
  store.set(fmt::format("{}/reachable/{}", key, rank), bytes_of(static_cast<int>(unreachable.empty())));
  std::string failed_ranks;
  for (int peer = 0; peer < world_size; ++peer) {
    const std::string peer_key = fmt::format("{}/reachable/{}", key, peer);
    store.wait({peer_key}, timeout);
    if (!from_bytes<int>(store.get(peer_key), peer_key)) failed_ranks += fmt::format(" {}", peer);
  }
  if (!failed_ranks.empty()) {
    throw UsageError(fmt::format(
        "copy-engine reductions need peer access between the GPUs of every pair of ranks, each rank on its own GPU; "
        "rank(s){} lack it{}. Turn them off (DDP_COPY_ENGINE_REDUCTIONS=0) or check `nvidia-smi topo -m`",
        failed_ranks,
        unreachable.empty() ? "" : fmt::format(" (this rank, cuda:{}, cannot reach{})", device_index, unreachable)));
  }
  for (int peer = 0; peer < world_size; ++peer) {
    if (peer == rank) continue;
    DDP_CUDA_CHECK(cudaIpcOpenMemHandle(reinterpret_cast<void**>(&bases_[peer]), peers[peer].handle,
                                        cudaIpcMemLazyEnablePeerAccess));
  }
}

CopyEngineReduction::~CopyEngineReduction() {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index_));
  if (drained_) {
    // The peers are done with this area (quiesce()): unmapping theirs and
    // freeing ours cannot pull memory from under a copy in flight.
    for (int peer = 0; peer < world_size_; ++peer) {
      if (peer != rank_ && bases_[peer] != nullptr) cudaIpcCloseMemHandle(bases_[peer]);
    }
    cudaFree(bases_[rank_]);
  }
  if (release_stream_ != nullptr && cudaStreamQuery(release_stream_) != cudaErrorNotReady) {
    cudaStreamDestroy(release_stream_);
    cudaFreeHost(release_values_);
  }
}

bool CopyEngineReduction::carries(const at::Tensor& tensor) {
  const at::ScalarType dtype = tensor.scalar_type();
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf) return false;
  if (tensor.numel() * static_cast<std::int64_t>(tensor.element_size()) < kMinBytes) return false;
  return !current_stream_capturing();
}

std::uint32_t* CopyEngineReduction::counter(int owner, Counter kind, int writer) const {
  return reinterpret_cast<std::uint32_t*>(bases_[owner]) + kind * world_size_ + writer;
}

void* CopyEngineReduction::slot(int owner, int writer) const {
  return bases_[owner] + kCounterBytes + writer * slot_bytes_;
}

void* CopyEngineReduction::result(int owner) const { return bases_[owner] + kCounterBytes + world_size_ * slot_bytes_; }

void CopyEngineReduction::all_reduce(const at::Tensor& tensor, ReduceOp op, cudaStream_t stream) {
  const std::int64_t element_size = tensor.element_size();
  const std::int64_t piece = world_size_ * (slot_bytes_ / element_size);
  char* data = static_cast<char*>(tensor.data_ptr());
  for (std::int64_t offset = 0; offset < tensor.numel(); offset += piece) {
    reduce_piece(data + offset * element_size, std::min(piece, tensor.numel() - offset), element_size, op,
                 chunk_dtype(tensor.scalar_type()), stream);
  }
}

void CopyEngineReduction::reduce_piece(char* data, std::int64_t numel, std::int64_t element_size, ReduceOp op,
                                       ChunkDtype dtype, cudaStream_t stream) {
  const std::uint32_t k = ++piece_;
  const std::int64_t align = kChunkAlignBytes / element_size;
  const std::int64_t chunk = (numel + world_size_ - 1) / world_size_ + align - 1;
  const std::int64_t chunk_numel = chunk / align * align;  // <= a slot: slots hold a multiple of `align`
  auto begin = [&](int owner) { return std::min<std::int64_t>(owner * chunk_numel, numel); };
  auto bytes = [&](int owner) { return (std::min(begin(owner) + chunk_numel, numel) - begin(owner)) * element_size; };
  auto peers = [&] {  // starting after this rank, so that no GPU receives from everyone at once
    std::vector<int> order;
    for (int step = 1; step < world_size_; ++step) order.push_back((rank_ + step) % world_size_);
    return order;
  }();

  // Reduce-scatter: each peer's chunk into its slot for us, once it has
  // consumed our previous one.
  for (const int peer : peers) {
    wait_for(stream, counter(rank_, kPushConsumed, peer), k - 1);
    if (bytes(peer) > 0) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(slot(peer, rank_), data + begin(peer) * element_size, bytes(peer),
                                     cudaMemcpyDeviceToDevice, stream));
    }
    signal(stream, counter(peer, kPushed, rank_), k);
  }
  for (const int peer : peers) {
    wait_for(stream, counter(rank_, kPushed, peer), k);
    wait_for(stream, counter(rank_, kResultPulled, peer), k - 1);  // our result area is free again
  }
  ChunkReduction reduction;
  char* own = data + begin(rank_) * element_size;
  for (int source = 0; source < world_size_; ++source) {
    reduction.sources[source] = source == rank_ ? own : slot(rank_, source);
  }
  reduction.source_count = world_size_;
  reduction.outputs[0] = own;
  reduction.outputs[1] = result(rank_);
  reduction.numel = bytes(rank_) / element_size;
  reduction.dtype = dtype;
  reduction.op = op == ReduceOp::kMax ? ChunkOp::kMax : ChunkOp::kSum;
  reduction.scale = op == ReduceOp::kAvg ? 1.0f / static_cast<float>(world_size_) : 1.0f;
  reduce_chunk(reduction, stream);
  for (const int peer : peers) {
    signal(stream, counter(peer, kPushConsumed, rank_), k);
    signal(stream, counter(peer, kReduced, rank_), k);
  }
  // All-gather: each peer's result into our tensor.
  for (const int peer : peers) {
    wait_for(stream, counter(rank_, kReduced, peer), k);
    if (bytes(peer) > 0) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(data + begin(peer) * element_size, result(peer), bytes(peer),
                                     cudaMemcpyDeviceToDevice, stream));
    }
    signal(stream, counter(peer, kResultPulled, rank_), k);
  }
}

void CopyEngineReduction::quiesce(cudaStream_t stream) {
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer == rank_) continue;
    wait_for(stream, counter(rank_, kPushConsumed, peer), piece_);
    wait_for(stream, counter(rank_, kResultPulled, peer), piece_);
  }
}

void CopyEngineReduction::release_waits() noexcept {
  // A peer that is still alive may overwrite a counter with a smaller value
  // afterwards; the failure path that calls this ends the job, so one write
  // that lets the queued waits pass is what is needed.
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index_));
  if (cudaMemcpyAsync(bases_[rank_], release_values_, kCounterBytes, cudaMemcpyHostToDevice, release_stream_) !=
      cudaSuccess) {
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (cudaStreamQuery(release_stream_) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

}  // namespace ddp::detail
