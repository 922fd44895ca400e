// The copy-engine all-reduce: see copy_engine_reduction.h for why and how.

#include "comm/copy_engine_reduction.h"

#include <algorithm>
#include <thread>

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <ddp/errors.h>

#include "comm/copy_engine_kernels.h"
#include "comm/store_record.h"
#include "cuda/cuda_check.h"

namespace ddp::detail {
namespace {

// Each slot holds one rank's copy of a chunk: 16 MiB, so that a 25 MiB DDP
// bucket is one piece on two GPUs. The staging area of a rank is its flags
// and world_size such slots (32 MiB on two GPUs, 128 MiB on eight): one per
// peer to push into, and its own, which holds its result for the peers.
constexpr std::int64_t kSlotBytes = 16 << 20;
constexpr std::int64_t kFlagBytes = 4096;
// Chunks start on 256-byte boundaries, so that the kernel's 16-byte loads
// and the copies stay aligned wherever the tensor itself is.
constexpr std::int64_t kChunkAlignBytes = 256;

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

void check_driver(CUresult result, const char* call, const char* file, int line) {
  if (result != CUDA_SUCCESS) {
    throw std::runtime_error(
        fmt::format("{} failed at {}:{}: CUresult {}", call, file, line, static_cast<int>(result)));
  }
}
#define DDP_DRIVER_CHECK(result, call) check_driver((result), call, __FILE__, __LINE__)

void write_flag(cudaStream_t stream, std::uint32_t* flag, std::uint32_t value) {
  // Without CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER: the write is fenced, so
  // a peer that sees it sees the copies queued before it too.
  DDP_DRIVER_CHECK(
      stream_memory_ops().write(stream, reinterpret_cast<CUdeviceptr>(flag), value, CU_STREAM_WRITE_VALUE_DEFAULT),
      "cuStreamWriteValue32");
}

/// Queues on `stream` a wait until `*flag` is raised (>= 1).
void wait_raised(cudaStream_t stream, std::uint32_t* flag) {
  DDP_DRIVER_CHECK(stream_memory_ops().wait(stream, reinterpret_cast<CUdeviceptr>(flag), 1, CU_STREAM_WAIT_VALUE_GEQ),
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

/// Rank `rank`'s record `key`/`rank`, once it is there (bounded by `timeout`).
template <typename T>
T read_record(c10d::Store& store, const std::string& key, int rank, std::chrono::milliseconds timeout) {
  const std::string rank_key = fmt::format("{}/{}", key, rank);
  store.wait({rank_key}, timeout);
  return from_store_record<T>(store.get(rank_key), fmt::format("malformed record '{}' in the store", rank_key));
}

/// Every rank says whether `ok` holds for it; returns the ranks where it did
/// not (" 1 3"), the same string on every rank.
std::string ranks_failing(c10d::Store& store, const std::string& key, int rank, int world_size, bool ok,
                          std::chrono::milliseconds timeout) {
  store.set(fmt::format("{}/{}", key, rank), store_record(static_cast<int>(ok)));
  std::string failing;
  for (int peer = 0; peer < world_size; ++peer) {
    if (!read_record<int>(store, key, peer, timeout)) failing += fmt::format(" {}", peer);
  }
  return failing;
}

}  // namespace

CopyEngineReduction::CopyEngineReduction(c10d::Store& store, const std::string& key, int rank, int world_size,
                                         int device_index, std::chrono::milliseconds timeout)
    : rank_(rank),
      world_size_(world_size),
      device_index_(device_index),
      peers_(peer_order(rank, world_size)),
      bases_(world_size, nullptr) {
  if (world_size < 2 || world_size > kMaxChunkSources) {
    throw UsageError(
        fmt::format("copy-engine reductions take 2 to {} GPUs of one node, not {}; turn them off "
                    "(DDP_COPY_ENGINE_REDUCTIONS=0)",
                    kMaxChunkSources, world_size));
  }
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  try {
    set_up(store, key, timeout);
  } catch (...) {
    free_resources(/*staging_area_too=*/true);  // the destructor does not run for a half-built object
    throw;
  }
}

void CopyEngineReduction::set_up(c10d::Store& store, const std::string& key, std::chrono::milliseconds timeout) {
  stream_memory_ops();  // fails here, at setup, if the driver lacks them
  DDP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&bases_[rank_]), kFlagBytes + world_size_ * kSlotBytes));
  // Every slot and result area starts free (its consumer's flag raised),
  // nothing pushed or reduced yet, no peer failed.
  std::vector<std::uint32_t> flags(flag_words(), 0);
  std::fill_n(flags.begin() + kPushConsumed * world_size_, world_size_, 1);
  std::fill_n(flags.begin() + kResultPulled * world_size_, world_size_, 1);
  DDP_CUDA_CHECK(cudaMemcpy(bases_[rank_], flags.data(), flags.size() * sizeof(std::uint32_t), cudaMemcpyHostToDevice));
  DDP_CUDA_CHECK(cudaDeviceSynchronize());  // the flags are set before any peer can see them
  DDP_CUDA_CHECK(cudaStreamCreateWithFlags(&release_stream_, cudaStreamNonBlocking));
  DDP_CUDA_CHECK(cudaStreamCreateWithFlags(&poll_stream_, cudaStreamNonBlocking));
  DDP_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&raised_), flag_words() * sizeof(std::uint32_t)));
  std::fill(raised_, raised_ + flag_words(), 1u);
  DDP_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&peers_failed_), world_size_ * sizeof(std::uint32_t)));

  Announcement mine{};
  DDP_CUDA_CHECK(cudaIpcGetMemHandle(&mine.handle, bases_[rank_]));
  mine.device_index = device_index_;
  store.set(fmt::format("{}/area/{}", key, rank_), store_record(mine));
  std::vector<Announcement> peers(world_size_);
  std::string unreachable;
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer == rank_) continue;
    peers[peer] = read_record<Announcement>(store, key + "/area", peer, timeout);
    int can_access = 0;
    DDP_CUDA_CHECK(cudaDeviceCanAccessPeer(&can_access, device_index_, peers[peer].device_index));
    if (!can_access || peers[peer].device_index == device_index_) {
      unreachable += fmt::format(" cuda:{} (rank {})", peers[peer].device_index, peer);
    }
  }
  // Every rank learns whether every rank can reach its peers, so that all
  // take the copy engines or all fail here, rather than some waiting forever.
  const std::string lacking =
      ranks_failing(store, key + "/reachable", rank_, world_size_, unreachable.empty(), timeout);
  if (!lacking.empty()) {
    throw UsageError(fmt::format(
        "copy-engine reductions need peer access between the GPUs of every pair of ranks, each rank on its own GPU; "
        "rank(s){} lack it{}. Turn them off (DDP_COPY_ENGINE_REDUCTIONS=0) or check `nvidia-smi topo -m`",
        lacking,
        unreachable.empty() ? "" : fmt::format(" (this rank, cuda:{}, cannot reach{})", device_index_, unreachable)));
  }
  std::string open_error;
  for (int peer = 0; peer < world_size_ && open_error.empty(); ++peer) {
    if (peer == rank_) continue;
    const cudaError_t opened = cudaIpcOpenMemHandle(reinterpret_cast<void**>(&bases_[peer]), peers[peer].handle,
                                                    cudaIpcMemLazyEnablePeerAccess);
    if (opened != cudaSuccess) {
      bases_[peer] = nullptr;
      open_error =
          fmt::format("cudaIpcOpenMemHandle of rank {}'s staging area failed: {}", peer, cudaGetErrorString(opened));
    }
  }
  const std::string unopened = ranks_failing(store, key + "/opened", rank_, world_size_, open_error.empty(), timeout);
  if (!unopened.empty()) {
    throw Error(
        fmt::format("libddp: rank(s){} could not map their peers' copy-engine staging areas{}; turn "
                    "copy-engine reductions off (DDP_COPY_ENGINE_REDUCTIONS=0)",
                    unopened, open_error.empty() ? "" : fmt::format(" (here: {})", open_error)));
  }
}

CopyEngineReduction::~CopyEngineReduction() {
  stop_release_ = true;
  if (release_thread_.joinable()) release_thread_.join();
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index_));
  // Without drained_, a peer may still copy into or out of the staging area:
  // it stays until the process exits.
  free_resources(/*staging_area_too=*/drained_);
}

void CopyEngineReduction::free_resources(bool staging_area_too) noexcept {
  // Teardown: errors have nowhere to go, and a failed release is no reason to
  // fail the job that is ending.
  if (staging_area_too) {
    for (int peer = 0; peer < world_size_; ++peer) {
      if (peer != rank_ && bases_[peer] != nullptr) (void)cudaIpcCloseMemHandle(bases_[peer]);
    }
    if (bases_[rank_] != nullptr) (void)cudaFree(bases_[rank_]);
  }
  for (cudaStream_t stream : {release_stream_, poll_stream_}) {
    if (stream == nullptr) continue;
    (void)cudaStreamSynchronize(stream);
    (void)cudaStreamDestroy(stream);
  }
  if (raised_ != nullptr) (void)cudaFreeHost(raised_);
  if (peers_failed_ != nullptr) (void)cudaFreeHost(peers_failed_);
}

bool CopyEngineReduction::reduces(const at::Tensor& tensor) {
  const at::ScalarType dtype = tensor.scalar_type();
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf) return false;
  return tensor.numel() * static_cast<std::int64_t>(tensor.element_size()) >= kMinBytes;
}

bool CopyEngineReduction::gathers(const at::Tensor& output) {
  return output.numel() * static_cast<std::int64_t>(output.element_size()) >= kMinBytes;
}

std::uint32_t* CopyEngineReduction::flag(int owner, Flag kind, int writer) const {
  return reinterpret_cast<std::uint32_t*>(bases_[owner]) + kind * world_size_ + writer;
}

void* CopyEngineReduction::slot(int owner, int writer) const {
  return bases_[owner] + kFlagBytes + writer * kSlotBytes;
}

void* CopyEngineReduction::result(int owner) const { return slot(owner, owner); }

std::uint32_t* CopyEngineReduction::failure_word(int owner, int writer) const {
  return reinterpret_cast<std::uint32_t*>(bases_[owner]) + kFlagKinds * world_size_ + writer;
}

std::vector<int> CopyEngineReduction::peer_order(int rank, int world_size) {
  // Starting after this rank, so that no GPU receives from everyone at once.
  std::vector<int> order;
  for (int step = 1; step < world_size; ++step) order.push_back((rank + step) % world_size);
  return order;
}

void CopyEngineReduction::all_reduce(const at::Tensor& tensor, ReduceOp op, cudaStream_t stream) {
  const std::int64_t element_size = tensor.element_size();
  const std::int64_t piece = world_size_ * (kSlotBytes / element_size);
  const std::int64_t align = kChunkAlignBytes / element_size;
  char* data = static_cast<char*>(tensor.data_ptr());
  for (std::int64_t offset = 0; offset < tensor.numel(); offset += piece) {
    // Each rank owns a chunk of the piece, 256-byte aligned, at most a slot
    // (slots hold a multiple of `align`); the last ones may be short or empty.
    const std::int64_t numel = std::min(piece, tensor.numel() - offset);
    const std::int64_t chunk = ((numel + world_size_ - 1) / world_size_ + align - 1) / align * align;
    Parts parts(world_size_);
    for (int owner = 0; owner < world_size_; ++owner) {
      const std::int64_t begin = std::min(offset + owner * chunk, offset + numel);
      parts[owner] = {data + begin * element_size, (std::min(begin + chunk, offset + numel) - begin) * element_size};
    }
    push_parts(parts, stream);
    const ChunkDtype dtype = chunk_dtype(tensor.scalar_type());
    reduce_own_part(parts[rank_].first, parts[rank_].first, /*share=*/true, parts[rank_].second / element_size, dtype,
                    dtype, op, stream);
    pull_parts(parts, stream);
  }
}

void CopyEngineReduction::reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op,
                                         cudaStream_t stream) {
  const std::int64_t element_size = input.element_size();
  const std::int64_t output_element_size = output.element_size();
  const std::int64_t numel = output.numel();
  const std::int64_t piece = kSlotBytes / element_size;
  char* in = static_cast<char*>(input.data_ptr());
  char* out = static_cast<char*>(output.data_ptr());
  for (std::int64_t offset = 0; offset < numel; offset += piece) {
    const std::int64_t length = std::min(piece, numel - offset);
    Parts parts(world_size_);
    for (int owner = 0; owner < world_size_; ++owner) {
      parts[owner] = {in + (owner * numel + offset) * element_size, length * element_size};
    }
    push_parts(parts, stream);
    reduce_own_part(parts[rank_].first, out + offset * output_element_size, /*share=*/false, length,
                    chunk_dtype(input.scalar_type()), chunk_dtype(output.scalar_type()), op, stream);
  }
}

void CopyEngineReduction::all_gather(const at::Tensor& output, const at::Tensor& input, cudaStream_t stream) {
  const std::int64_t bytes = input.numel() * static_cast<std::int64_t>(input.element_size());
  char* in = static_cast<char*>(input.data_ptr());
  char* out = static_cast<char*>(output.data_ptr());
  for (std::int64_t offset = 0; offset < bytes; offset += kSlotBytes) {
    const std::int64_t length = std::min(kSlotBytes, bytes - offset);
    for (const int peer : peers_) take(stream, flag(rank_, kResultPulled, peer));  // our result area is free
    DDP_CUDA_CHECK(cudaMemcpyAsync(result(rank_), in + offset, length, cudaMemcpyDeviceToDevice, stream));
    for (const int peer : peers_) raise(stream, flag(peer, kReduced, rank_));
    Parts parts(world_size_);
    for (int owner = 0; owner < world_size_; ++owner) parts[owner] = {out + owner * bytes + offset, length};
    pull_parts(parts, stream);
    if (parts[rank_].first != in + offset) {  // not in place
      DDP_CUDA_CHECK(cudaMemcpyAsync(parts[rank_].first, in + offset, length, cudaMemcpyDeviceToDevice, stream));
    }
  }
}

void CopyEngineReduction::push_parts(const Parts& parts, cudaStream_t stream) {
  for (const int peer : peers_) {
    take(stream, flag(rank_, kPushConsumed, peer));  // the peer has reduced our previous push
    if (parts[peer].second > 0) {
      DDP_CUDA_CHECK(
          cudaMemcpyAsync(slot(peer, rank_), parts[peer].first, parts[peer].second, cudaMemcpyDeviceToDevice, stream));
    }
    raise(stream, flag(peer, kPushed, rank_));
  }
}

void CopyEngineReduction::reduce_own_part(const char* own, char* output, bool share, std::int64_t numel,
                                          ChunkDtype dtype, ChunkDtype output_dtype, ReduceOp op, cudaStream_t stream) {
  for (const int peer : peers_) {
    take(stream, flag(rank_, kPushed, peer));
    if (share) take(stream, flag(rank_, kResultPulled, peer));  // our result area is free again
  }
  ChunkReduction reduction;
  for (int source = 0; source < world_size_; ++source) {
    reduction.sources[source] = source == rank_ ? own : slot(rank_, source);
  }
  reduction.source_count = world_size_;
  reduction.outputs[0] = output;
  reduction.outputs[1] = share ? result(rank_) : nullptr;
  reduction.numel = numel;
  reduction.dtype = dtype;
  reduction.output_dtype = output_dtype;
  reduction.op = op == ReduceOp::kMax ? ChunkOp::kMax : ChunkOp::kSum;
  reduction.scale = op == ReduceOp::kAvg ? 1.0f / static_cast<float>(world_size_) : 1.0f;
  reduce_chunk(reduction, stream);
  for (const int peer : peers_) {
    raise(stream, flag(peer, kPushConsumed, rank_));
    if (share) raise(stream, flag(peer, kReduced, rank_));
  }
}

void CopyEngineReduction::pull_parts(const Parts& parts, cudaStream_t stream) {
  for (const int peer : peers_) {
    take(stream, flag(rank_, kReduced, peer));
    if (parts[peer].second > 0) {
      DDP_CUDA_CHECK(
          cudaMemcpyAsync(parts[peer].first, result(peer), parts[peer].second, cudaMemcpyDeviceToDevice, stream));
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

void CopyEngineReduction::release_after_failure() noexcept {
  if (releasing_.exchange(true)) return;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index_));
  // First the peers hear of it: what this rank's stream still sends them is no
  // reduction, and their watchdogs fail their collectives (failed_peers()).
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer != rank_)
      (void)cudaMemcpyAsync(failure_word(peer, rank_), raised_, sizeof(std::uint32_t), cudaMemcpyHostToDevice,
                            release_stream_);
  }
  // Then this rank's flags are raised again and again until the destructor:
  // each queued wait passes and lowers its flag, and the next one, on the
  // communicator's stream or in a CUDA graph's replay, must find its flag
  // raised too, while NCCL's abort ends NCCL's kernels between them.
  release_thread_ = std::thread([this] {
    c10::cuda::CUDAGuard thread_guard(static_cast<c10::DeviceIndex>(device_index_));
    while (!stop_release_) {
      if (cudaMemcpyAsync(bases_[rank_], raised_, kFlagKinds * world_size_ * sizeof(std::uint32_t),
                          cudaMemcpyHostToDevice, release_stream_) != cudaSuccess ||
          cudaStreamSynchronize(release_stream_) != cudaSuccess) {
        return;  // the context is gone: nothing queued will run anyway
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
}

std::string CopyEngineReduction::failed_peers() noexcept {
  std::lock_guard<std::mutex> lock(poll_mutex_);  // the watchdog and waiting threads both ask
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index_));
  const cudaError_t read = cudaMemcpyAsync(peers_failed_, failure_word(rank_, 0), world_size_ * sizeof(std::uint32_t),
                                           cudaMemcpyDeviceToHost, poll_stream_);
  const cudaError_t synchronized = read == cudaSuccess ? cudaStreamSynchronize(poll_stream_) : read;
  if (synchronized != cudaSuccess) {
    return fmt::format("reading the copy-engine staging area's failure words failed: {}",
                       cudaGetErrorString(synchronized));
  }
  std::string ranks;
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer != rank_ && peers_failed_[peer] != 0) ranks += fmt::format(" {}", peer);
  }
  if (ranks.empty()) return {};
  return fmt::format(
      "rank(s){} abandoned their copy-engine reductions after a failure of their own, so what this "
      "rank's collectives received from them is no reduction",
      ranks);
}

}  // namespace ddp::detail
