// NCCL backend: CUDA tensors, one communicator per process and device.
//
// Collectives run on the communicator's own stream. Each launch makes that
// stream wait for an event recorded on the caller's current stream, so the
// collective sees everything queued before it, and records a completion event
// that callers order their stream on (Work::wait_stream) or that the host
// polls (Work::wait, the watchdog). The host never synchronises the device.
//
// The communicator is blocking. NCCL's non-blocking mode would let every call
// be bounded, but it hands each collective to a new host thread and costs
// about 60 us per call against 7 us (measured on 2xH200, NCCL 2.28), which
// DDP's many bucket launches cannot afford. Hangs are bounded instead by:
//  - creating the communicator on a helper thread, with a deadline;
//  - the watchdog, which cancels a collective that timed out on the device
//    with ncclCommAbort (its kernels then return), and ends the process if a
//    host thread is stuck inside an NCCL call past its deadline.

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <ATen/cuda/CUDAEvent.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <ddp/errors.h>

#include "comm/backends.h"
#ifdef DDP_WITH_COPY_ENGINE_REDUCTIONS
#include "comm/copy_engine_reduction.h"
#endif
#include "comm/nccl_check.h"
#include "comm/store_record.h"
#include "compat/torch_compat.h"
#include "cuda/cuda_check.h"
#include "cuda/stream_capture.h"

namespace ddp::detail {
namespace {

ncclDataType_t to_nccl(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kChar: return ncclInt8;
    case at::kByte: return ncclUint8;
    case at::kBool: return ncclUint8;
#if DDP_TORCH_HAS_FLOAT8 && NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
    case at::kFloat8_e4m3fn: return ncclFloat8e4m3;
    case at::kFloat8_e5m2: return ncclFloat8e5m2;
#endif
    default:
      throw UsageError(fmt::format("libddp: NCCL cannot carry tensors of dtype {}", c10::toString(type)));
  }
}

ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
  }
  return ncclSum;
}

class NcclOp final : public BackendOp {
 public:
  // A collective recorded into a CUDA graph was not launched: it runs at
  // each replay, which CapturedStep watches as a whole. Its events are graph
  // nodes that must not be queried.
  bool poll() override {
    if (captured) return true;
    if (!done.query()) return false;
    if (check_peers) {
      const std::string failed = check_peers();
      if (!failed.empty()) throw Error(failed);
    }
    return true;
  }
  bool order_current_stream() override {
    done.block(c10::cuda::getCurrentCUDAStream(device_index));
    return true;
  }

  c10::DeviceIndex device_index = 0;
  bool captured = false;
  at::cuda::CUDAEvent done;
  /// For a collective whose data came from peers through the copy engines: a
  /// peer that gave up may have sent what it had; non-empty says so.
  std::function<std::string()> check_peers;
};

class NcclCommunicator final : public CommunicatorBase {
 public:
  NcclCommunicator(Setup setup, int device_index, bool copy_engine_reductions)
      : CommunicatorBase(setup),
        device_index_(static_cast<c10::DeviceIndex>(device_index)),
        // Normal priority, as PyTorch's ProcessGroupNCCL: with a high-priority
        // stream NCCL's kernels claimed SMs early and slowed ResNet-50's backward
        // at batch 256 by 2.34 ms against 1.02 ms (2xH200, one run each;
        // benchmarks/results/2026-11-22-ddp-overlap-resnet50-2xH200.md).
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_index_)) {
    c10::cuda::CUDAGuard guard(device_index_);
    const ncclUniqueId id = exchange_unique_id(*setup.store, "ddp/nccl/" + setup.name + "/unique_id");
    comm_ = create_communicator(id, setup.world_size, setup.rank, device_index, setup.timeout);
    if (copy_engine_reductions && setup.world_size > 1) {
#ifdef DDP_WITH_COPY_ENGINE_REDUCTIONS
      try {
        copy_engine_ = std::make_shared<CopyEngineReduction>(*setup.store, "ddp/copy_engine/" + setup.name, setup.rank,
                                                             setup.world_size, device_index, setup.timeout);
      } catch (...) {
        abort_nccl();  // the destructor does not run for a half-built object
        throw;
      }
#else
      throw UsageError(
          "libddp was built without copy-engine reductions (they need its CUDA kernels); turn them off "
          "(DDP_COPY_ENGINE_REDUCTIONS=0)");
#endif
    }
    start_watchdog();
  }

  ~NcclCommunicator() override {
    stop_watchdog();
    if (comm_ != nullptr) release();
  }

  Backend backend() const override { return Backend::kNccl; }
  c10::Device device() const override { return c10::Device(c10::kCUDA, device_index_); }

 protected:
  std::unique_ptr<BackendOp> launch_all_reduce(const at::Tensor& tensor, ReduceOp op) override {
#ifdef DDP_WITH_COPY_ENGINE_REDUCTIONS
    if (copy_engine_ && CopyEngineReduction::reduces(tensor)) {
      return launch_on_copy_engines({tensor},
                                    [&](cudaStream_t stream) { copy_engine_->all_reduce(tensor, op, stream); });
    }
#endif
    return launch({tensor}, "ncclAllReduce", [&](cudaStream_t stream) {
      return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), to_nccl(tensor.scalar_type()),
                           to_nccl(op), comm_, stream);
    });
  }

  std::unique_ptr<BackendOp> launch_broadcast(const at::Tensor& tensor, int root) override {
    return launch({tensor}, "ncclBroadcast", [&](cudaStream_t stream) {
      return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), to_nccl(tensor.scalar_type()),
                           root, comm_, stream);
    });
  }

  std::unique_ptr<BackendOp> launch_all_gather(const at::Tensor& output, const at::Tensor& input) override {
#ifdef DDP_WITH_COPY_ENGINE_REDUCTIONS
    if (copy_engine_ && CopyEngineReduction::gathers(output)) {
      return launch_on_copy_engines({output, input},
                                    [&](cudaStream_t stream) { copy_engine_->all_gather(output, input, stream); });
    }
#endif
    return launch({output, input}, "ncclAllGather", [&](cudaStream_t stream) {
      return ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(), to_nccl(input.scalar_type()), comm_,
                           stream);
    });
  }

  std::unique_ptr<BackendOp> launch_reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                                                   ReduceOp op) override {
#ifdef DDP_WITH_COPY_ENGINE_REDUCTIONS
    if (copy_engine_ && CopyEngineReduction::reduces(input)) {
      return launch_on_copy_engines(
          {output, input}, [&](cudaStream_t stream) { copy_engine_->reduce_scatter(output, input, op, stream); });
    }
#endif
    // NCCL reduces in one dtype: a wider output takes a part in the input's, widened on our stream.
    const bool widens = output.scalar_type() != input.scalar_type();
    const at::Tensor reduced = widens ? at::empty({output.numel()}, input.options()) : output;
    return launch({output, input, reduced}, "ncclReduceScatter", [&](cudaStream_t stream) {
      const ncclResult_t result = ncclReduceScatter(input.data_ptr(), reduced.data_ptr(), reduced.numel(),
                                                    to_nccl(input.scalar_type()), to_nccl(op), comm_, stream);
      if (result == ncclSuccess && widens) {
        const c10::cuda::CUDAStreamGuard on_our_stream(stream_);
        output.view({-1}).copy_(reduced);
      }
      return result;
    });
  }

  std::unique_ptr<BackendOp> launch_stream_marker() override {
    c10::cuda::CUDAGuard guard(device_index_);
    auto op = std::make_unique<NcclOp>();
    op->device_index = device_index_;
    op->done.record(c10::cuda::getCurrentCUDAStream(device_index_));
    return op;
  }

  /// After a failure: the copy engines' waits are released from a helper
  /// thread while NCCL's abort ends NCCL's kernels, in whatever order the two
  /// kinds of work were queued.
  void abort() noexcept override {
#ifdef DDP_WITH_COPY_ENGINE_REDUCTIONS
    if (copy_engine_) copy_engine_->release_after_failure();
#endif
    abort_nccl();
  }

  std::string poll_async_error() override {
#ifdef DDP_WITH_COPY_ENGINE_REDUCTIONS
    if (copy_engine_) {
      std::string failed = copy_engine_->failed_peers();
      if (!failed.empty()) return failed;
    }
#endif
    if (comm_ == nullptr) return {};
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) return "ncclCommGetAsyncError failed";
    if (state == ncclSuccess) return {};
    const char* last = ncclGetLastError(comm_);
    return fmt::format("NCCL reported an asynchronous error: {}{}", ncclGetErrorString(state),
                       last != nullptr && *last != '\0' ? fmt::format(" ({})", last) : "");
  }

 private:
  template <typename Call>
  std::unique_ptr<NcclOp> launch(std::initializer_list<at::Tensor> tensors, const char* name, Call&& call) {
    c10::cuda::CUDAGuard guard(device_index_);
    auto op = std::make_unique<NcclOp>();
    op->device_index = device_index_;
    op->captured = current_stream_capturing();
    at::cuda::CUDAEvent ready;
    ready.record(c10::cuda::getCurrentCUDAStream(device_index_));
    ready.block(stream_);
    // The caller may free these tensors before the collective ends; the
    // caching allocator must not hand their memory out until our stream is done.
    // recordStream, not PyTorch's stash-until-observed: ZeRO-2 frees each
    // gradient bucket right after launching its reduce-scatter, and that
    // memory must come back as soon as the collective ends. A stash returns
    // it only when a host thread next observes the end (the watchdog's poll,
    // or the reducer's wait at the end of backward), so a backward's buckets
    // would all stay allocated until then: the peak ZeRO-2 exists to cut.
    // The cost is an event per recorded block when it is freed.
    for (const at::Tensor& tensor : tensors) {
      c10::cuda::CUDACachingAllocator::recordStream(tensor.storage().data_ptr(), stream_);
    }
    check_nccl(call(stream_.stream()), name, comm_);
    op->done.record(stream_);
    return op;
  }

#ifdef DDP_WITH_COPY_ENGINE_REDUCTIONS
  /// A collective the copy engines carry: launched as NCCL's are, and checked
  /// at completion for a peer that gave up and sent what it had.
  template <typename Queue>
  std::unique_ptr<BackendOp> launch_on_copy_engines(std::initializer_list<at::Tensor> tensors, Queue&& queue) {
    auto op = launch(tensors, "copy-engine collective", [&](cudaStream_t stream) {
      queue(stream);
      return ncclSuccess;
    });
    op->check_peers = [weak = std::weak_ptr<CopyEngineReduction>(copy_engine_)] {
      const auto copy_engine = weak.lock();  // a Work may outlive its communicator
      return copy_engine ? copy_engine->failed_peers() : std::string();
    };
    return op;
  }
#endif

  /// ncclCommInitRank blocks until every rank has joined; it runs on a helper
  /// thread so that a rank that never joins costs a bounded wait and an error,
  /// not a hang. (Should the deadline pass, the helper is abandoned.)
  static ncclComm_t create_communicator(const ncclUniqueId& id, int world_size, int rank, int device_index,
                                        std::chrono::milliseconds timeout) {
    struct Outcome {
      std::mutex mutex;
      std::condition_variable finished;
      bool done = false;
      ncclComm_t comm = nullptr;
      std::string error;
    };
    auto outcome = std::make_shared<Outcome>();
    std::thread([outcome, id, world_size, rank, device_index] {
      ncclComm_t comm = nullptr;
      std::string error;
      try {
        DDP_CUDA_CHECK(cudaSetDevice(device_index));
        DDP_NCCL_CHECK(ncclCommInitRank(&comm, world_size, id, rank), nullptr);
      } catch (const std::exception& e) {
        error = e.what();
      }
      std::lock_guard<std::mutex> lock(outcome->mutex);
      outcome->done = true;
      outcome->comm = comm;
      outcome->error = error;
      outcome->finished.notify_all();
    }).detach();

    std::unique_lock<std::mutex> lock(outcome->mutex);
    const bool done = outcome->finished.wait_for(lock, timeout, [&] { return outcome->done; });
    if (!done || !outcome->error.empty()) {
      throw Error(fmt::format(
          "libddp: rank {} could not set up its NCCL communicator on cuda:{}: {}. All {} ranks must start and "
          "reach ddp::init(); look at the output of the other ranks.",
          rank, device_index,
          done ? outcome->error : fmt::format("ncclCommInitRank did not finish within {} ms", timeout.count()),
          world_size));
    }
    return outcome->comm;
  }

  ncclUniqueId exchange_unique_id(c10d::Store& store, const std::string& key) {
    if (rank() != 0) {
      return from_store_record<ncclUniqueId>(store.get(key),
                                             fmt::format("rank {} read a malformed NCCL id from the store", rank()));
    }
    ncclUniqueId id;
    DDP_NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
    store.set(key, store_record(id));
    return id;
  }

  /// Waits (bounded) for queued collectives, then releases the communicator
  /// with ncclCommAbort, which, unlike ncclCommDestroy, never waits for peers.
  void release() noexcept {
    const Clock::time_point deadline = Clock::now() + timeout();
    c10::cuda::CUDAGuard guard(device_index_);
#ifdef DDP_WITH_COPY_ENGINE_REDUCTIONS
    bool quiescing = false;
    if (copy_engine_) {
      try {
        copy_engine_->quiesce(stream_.stream());
        quiescing = true;
      } catch (const std::exception&) {
        // Not freed then: a peer may still copy into the staging area.
      }
    }
#endif
    while (cudaStreamQuery(stream_.stream()) == cudaErrorNotReady && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
#ifdef DDP_WITH_COPY_ENGINE_REDUCTIONS
    if (copy_engine_) copy_engine_->set_drained(quiescing && cudaStreamQuery(stream_.stream()) == cudaSuccess);
#endif
    abort_nccl();
  }

  void abort_nccl() noexcept {
    if (comm_ == nullptr) return;
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  const c10::DeviceIndex device_index_;
  c10::cuda::CUDAStream stream_;
  ncclComm_t comm_ = nullptr;
#ifdef DDP_WITH_COPY_ENGINE_REDUCTIONS
  std::shared_ptr<CopyEngineReduction> copy_engine_;  // null unless asked for
#endif
};

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(CommunicatorBase::Setup setup, int device_index,
                                                     bool copy_engine_reductions) {
  // Binds the process to its GPU: LibTorch's current device, so tensors the
  // program creates on "cuda" land where NCCL expects them.
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_index));
  return std::make_shared<NcclCommunicator>(std::move(setup), device_index, copy_engine_reductions);
}

}  // namespace ddp::detail
