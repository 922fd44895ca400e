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

namespace ddp::detail {
namespace {

// Each slot holds one rank's copy of a chunk: 16 MiB, so that a 25 MiB DDP
// bucket is one piece on two GPUs. The staging area of a rank is its flags
// and world_size + 1 such slots (48 MiB on two GPUs).
constexpr std::int64_t kSlotBytes = 16 << 20;
constexpr std::int64_t kFlagBytes = 4096;
// Chunks start on 256-byte boundaries, so that the kernel's 16-byte loads
// and the copies stay aligned wherever the tensor itself is.
constexpr std::int64_t kChunkAlignBytes = 256;
// What release_waits() writes into every flag: raised.
constexpr std::uint32_t kReleased = 1;

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

void write_flag(cudaStream_t stream, std::uint32_t* flag, std::uint32_t value) {
  // Without CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER: the write is fenced, so
  // a peer that sees it sees the copies queued before it too.
  check_driver(
      stream_memory_ops().write(stream, reinterpret_cast<CUdeviceptr>(flag), value, CU_STREAM_WRITE_VALUE_DEFAULT),
      "cuStreamWriteValue32");
}

/// Queues on `stream` a wait until `*flag` is raised (>= 1).
void wait_raised(cudaStream_t stream, std::uint32_t* flag) {
  check_driver(stream_memory_ops().wait(stream, reinterpret_cast<CUdeviceptr>(flag), 1, CU_STREAM_WAIT_VALUE_GEQ),
               "cuStreamWaitValue32");
}

/// Queues on `stream` the raise of `*flag`, here or on a peer.
void raise(cudaStream_t stream, std::uint32_t* flag) { write_flag(stream, flag, 1); }

/// Queues on `stream` a wait until this rank's `*flag` is raised, then its
/// lowering, before anything that lets the peer raise it again.
void take(cudaStream_t stream, std::uint32_t* flag) {
  wait_raised(stream, flag);
  write_flag(stream, flag, 0);
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
  DDP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&own), kFlagBytes + (world_size + 1) * slot_bytes_));
  bases_[rank] = own;
  // Every slot and result area starts free (its consumer's flag raised),
  // nothing pushed or reduced yet.
  std::vector<std::uint32_t> flags(kFlagKinds * world_size, 0);
  std::fill_n(flags.begin() + kPushConsumed * world_size, world_size, 1);
  std::fill_n(flags.begin() + kResultPulled * world_size, world_size, 1);
  DDP_CUDA_CHECK(cudaMemcpy(own, flags.data(), flags.size() * sizeof(std::uint32_t), cudaMemcpyHostToDevice));
  DDP_CUDA_CHECK(cudaDeviceSynchronize());  // the flags are set before any peer can see them
  DDP_CUDA_CHECK(cudaStreamCreateWithFlags(&release_stream_, cudaStreamNonBlocking));
  DDP_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&release_values_), kFlagBytes));
  std::fill(release_values_, release_values_ + kFlagBytes / sizeof(std::uint32_t), kReleased);

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
  return tensor.numel() * static_cast<std::int64_t>(tensor.element_size()) >= kMinBytes;
}

std::uint32_t* CopyEngineReduction::flag(int owner, Flag kind, int writer) const {
  return reinterpret_cast<std::uint32_t*>(bases_[owner]) + kind * world_size_ + writer;
}

void* CopyEngineReduction::slot(int owner, int writer) const {
  return bases_[owner] + kFlagBytes + writer * slot_bytes_;
}

void* CopyEngineReduction::result(int owner) const { return bases_[owner] + kFlagBytes + world_size_ * slot_bytes_; }

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
    take(stream, flag(rank_, kPushConsumed, peer));
    if (bytes(peer) > 0) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(slot(peer, rank_), data + begin(peer) * element_size, bytes(peer),
                                     cudaMemcpyDeviceToDevice, stream));
    }
    raise(stream, flag(peer, kPushed, rank_));
  }
  for (const int peer : peers) {
    take(stream, flag(rank_, kPushed, peer));
    take(stream, flag(rank_, kResultPulled, peer));  // our result area is free again
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
    raise(stream, flag(peer, kPushConsumed, rank_));
    raise(stream, flag(peer, kReduced, rank_));
  }
  // All-gather: each peer's result into our tensor.
  for (const int peer : peers) {
    take(stream, flag(rank_, kReduced, peer));
    if (bytes(peer) > 0) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(data + begin(peer) * element_size, result(peer), bytes(peer),
                                     cudaMemcpyDeviceToDevice, stream));
    }
    raise(stream, flag(peer, kResultPulled, rank_));
  }
}

void CopyEngineReduction::quiesce(cudaStream_t stream) {
  // Raised by a peer after its last copy out of our slot or result area.
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer == rank_) continue;
    wait_raised(stream, flag(rank_, kPushConsumed, peer));
    wait_raised(stream, flag(rank_, kResultPulled, peer));
  }
}

void CopyEngineReduction::release_waits(cudaStream_t stream) noexcept {
  // Raises every flag of this rank, again and again: the stream lowers each
  // flag it takes, and must find the next one raised too, until it has
  // drained. Bounded: a peer that is still alive may keep writing.
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index_));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  do {
    if (cudaMemcpyAsync(bases_[rank_], release_values_, kFlagBytes, cudaMemcpyHostToDevice, release_stream_) !=
            cudaSuccess ||
        cudaStreamSynchronize(release_stream_) != cudaSuccess) {
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  } while (cudaStreamQuery(stream) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline);
}

}  // namespace ddp::detail
