// Gloo backend: CPU tensors, carried by LibTorch's c10d::ProcessGroupGloo.

#include <cstdlib>
#include <functional>
#include <string>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <ddp/errors.h>

#include "comm/backends.h"

namespace ddp::detail {
namespace {

class GlooOp final : public BackendOp {
 public:
  GlooOp(c10::intrusive_ptr<c10d::Work> work, std::function<void()> on_success)
      : work_(std::move(work)), on_success_(std::move(on_success)) {}

  bool poll() override {
    if (!work_->isCompleted()) return false;
    if (!work_->isSuccess()) std::rethrow_exception(work_->exception());
    if (on_success_) {
      on_success_();
      on_success_ = nullptr;
    }
    return true;
  }

  bool order_current_stream() override { return false; }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::function<void()> on_success_;  // finishes what Gloo cannot do itself
};

c10d::ReduceOp to_c10d(ReduceOp op) {
  // Gloo has no average: ranks divide before summing (see launch_all_reduce).
  return op == ReduceOp::kMax ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
}

/// Gloo ops run on the CPU. Without GLOO_SOCKET_IFNAME, c10d picks the
/// interface that the host name resolves to and falls back to loopback.
std::shared_ptr<::gloo::transport::Device> make_device(int rank) {
  if (const char* interface = std::getenv("GLOO_SOCKET_IFNAME")) {
    try {
      return c10d::ProcessGroupGloo::createDeviceForInterface(interface);
    } catch (const std::exception& e) {
      throw UsageError(
          fmt::format("rank {}: GLOO_SOCKET_IFNAME={} names no network interface Gloo can use on this "
                      "host ({}); give one that `ip addr` lists, or unset it",
                      rank, interface, first_line_of(e)));
    }
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

class GlooCommunicator final : public CommunicatorBase {
 public:
  explicit GlooCommunicator(Setup setup) : CommunicatorBase(setup) {
    auto options = c10d::ProcessGroupGloo::Options::create(setup.timeout);
    options->devices.push_back(make_device(setup.rank));
    auto store = c10::make_intrusive<c10d::PrefixStore>("ddp/gloo/" + setup.name, setup.store);
    try {
      group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store, setup.rank, setup.world_size, options);
    } catch (const std::exception& e) {
      // Every rank publishes its address and connects to every other: a rank
      // that never published (it failed, or never started) leaves the others here.
      throw Error(
          fmt::format("libddp: rank {} of {} could not connect the Gloo communicator to the other ranks "
                      "within {} ms (one that failed or never started is the usual cause): {}",
                      setup.rank, setup.world_size, setup.timeout.count(), first_line_of(e)));
    }
    start_watchdog();
  }

  ~GlooCommunicator() override { stop_watchdog(); }

  Backend backend() const override { return Backend::kGloo; }
  c10::Device device() const override { return c10::Device(c10::kCPU); }

 protected:
  std::unique_ptr<BackendOp> launch_all_reduce(const at::Tensor& tensor, ReduceOp op) override {
    at::Tensor buffer = reduction_buffer(tensor, /*copy=*/false);
    auto work = start_all_reduce(buffer, op);
    std::function<void()> copy_back;
    if (!buffer.is_same(tensor)) copy_back = [tensor, buffer]() mutable { tensor.copy_(buffer); };
    return std::make_unique<GlooOp>(std::move(work), std::move(copy_back));
  }

  std::unique_ptr<BackendOp> launch_broadcast(const at::Tensor& tensor, int root) override {
    std::vector<at::Tensor> tensors{as_bits(tensor)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    return std::make_unique<GlooOp>(group_->broadcast(tensors, options), nullptr);
  }

  std::unique_ptr<BackendOp> launch_all_gather(const at::Tensor& output, const at::Tensor& input) override {
    // Gloo gathers into one tensor per rank; views of `output` make that the
    // flat result. An input that is this rank's part of the output (in place)
    // is copied first: Gloo copies it into that part.
    std::vector<std::vector<at::Tensor>> outputs{as_bits(output).view({-1}).chunk(world_size())};
    std::vector<at::Tensor> inputs{as_bits(input.is_alias_of(output) ? input.clone() : input)};
    return std::make_unique<GlooOp>(group_->allgather(outputs, inputs), nullptr);
  }

  std::unique_ptr<BackendOp> launch_reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                                                   ReduceOp op) override {
    // Not every LibTorch libddp builds against has a Gloo reduce-scatter:
    // all-reduce a copy of the whole input and keep this rank's part. Twice
    // the traffic of a real one; Gloo carries CPU jobs, not large models.
    at::Tensor buffer = reduction_buffer(input, /*copy=*/true);
    auto work = start_all_reduce(buffer, op);
    const std::int64_t part = output.numel();
    std::function<void()> copy_part = [output, buffer, part, rank = rank()]() mutable {
      output.view({-1}).copy_(buffer.view({-1}).narrow(0, rank * part, part));
    };
    return std::make_unique<GlooOp>(std::move(work), std::move(copy_part));
  }

  void abort() noexcept override {
    // Gloo fails every pending operation itself once a peer is gone or its
    // timeout passes; there is nothing to cancel from here.
  }

 private:
  /// Gloo reduces in the tensor's own dtype; bf16/fp16 sums keep few bits,
  /// so 16-bit tensors are reduced in fp32. `copy`: never `tensor` itself.
  static at::Tensor reduction_buffer(const at::Tensor& tensor, bool copy) {
    const bool is_16_bit = tensor.scalar_type() == at::kBFloat16 || tensor.scalar_type() == at::kHalf;
    return tensor.to(is_16_bit ? at::kFloat : tensor.scalar_type(), /*non_blocking=*/false, copy);
  }

  /// Starts reducing `buffer` in place; Gloo has no average, so for kAvg
  /// every rank divides before the sum.
  c10::intrusive_ptr<c10d::Work> start_all_reduce(at::Tensor& buffer, ReduceOp op) {
    if (op == ReduceOp::kAvg) buffer.div_(world_size());
    std::vector<at::Tensor> tensors{buffer};
    c10d::AllreduceOptions options;
    options.reduceOp = to_c10d(op);
    return group_->allreduce(tensors, options);
  }

  /// Copies move bits, not numbers: bf16, which older Gloo cannot carry,
  /// travels as a same-width fp16 view of the same memory.
  static at::Tensor as_bits(const at::Tensor& tensor) {
    return tensor.scalar_type() == at::kBFloat16 ? tensor.view(at::kHalf) : tensor;
  }

  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
};

}  // namespace

std::shared_ptr<Communicator> make_gloo_communicator(CommunicatorBase::Setup setup) {
  return std::make_shared<GlooCommunicator>(std::move(setup));
}

}  // namespace ddp::detail
