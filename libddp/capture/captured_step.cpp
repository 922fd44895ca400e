// ddp::CapturedStep: eager warm-up, one recording into a CUDA graph, replays.
//
// The recording runs on a side stream (a graph cannot be captured on the
// default stream) in thread-local capture mode: the communicator's watchdog
// and the autograd engine's threads keep running while the capturing thread
// records, and only this thread is barred from calls that would break the
// capture. NCCL collectives launched from the reducer's hooks are recorded
// with their event edges, so the comm stream joins the graph and the buckets
// overlap backward in the replay as they do eagerly.

#include <ddp/captured_step.h>

#include <string>
#include <utility>

#include <fmt/format.h>
#include <torch/optim/optimizer.h>

#include <ddp/errors.h>
#include <ddp/optim.h>

#include "comm/communicator_base.h"

#ifdef DDP_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace ddp {
namespace {

std::string describe(const at::Tensor& tensor) {
  return fmt::format("{} {} on {}", c10::str(tensor.sizes()), c10::toString(tensor.scalar_type()),
                     tensor.device().str());
}

}  // namespace

struct CapturedStep::Impl {
  torch::optim::Optimizer* stepped = nullptr;
  optim::CapturableOptimizer* optimizer = nullptr;
  Function function;
  CapturedStepOptions options;
  // The process group's communicator, which watches each replay; null
  // without a process group.
  detail::CommunicatorBase* watcher = nullptr;
  int eager_steps = 0;
  std::vector<at::Tensor> static_inputs;
  at::Tensor static_output;
  // The gradients the optimizer's parameters had when the recording began.
  // The recording zeroes them, and a backward (e.g. a sharded mode's) may
  // then give the parameters new ones: every replay still writes the old
  // tensors, whose memory must therefore never go to another tensor.
  std::vector<at::Tensor> gradients_at_recording;
#ifdef DDP_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif

  void check_inputs(const std::vector<at::Tensor>& inputs) const {
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (!inputs[i].defined() || !inputs[i].is_cuda()) {
        throw UsageError(
            fmt::format("ddp::CapturedStep: input {} is {}; a CUDA graph records GPU work only: move "
                        "the batch to the GPU, or run the step eagerly on the CPU",
                        i, inputs[i].defined() ? describe(inputs[i]) : "undefined"));
      }
    }
    if (static_inputs.empty()) return;
    if (inputs.size() != static_inputs.size()) {
      throw UsageError(
          fmt::format("ddp::CapturedStep: {} inputs, the recorded step took {}; call reset() to record "
                      "the step anew",
                      inputs.size(), static_inputs.size()));
    }
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const at::Tensor& recorded = static_inputs[i];
      if (inputs[i].sizes() != recorded.sizes() || inputs[i].scalar_type() != recorded.scalar_type() ||
          inputs[i].device() != recorded.device()) {
        throw UsageError(
            fmt::format("ddp::CapturedStep: input {} is {}, the recorded step's is {}; a replay "
                        "repeats the recorded shapes: call reset() to record the step anew for these "
                        "(or pad the batch to the recorded shape)",
                        i, describe(inputs[i]), describe(recorded)));
      }
    }
  }

#ifdef DDP_WITH_CUDA
  void record(const std::vector<at::Tensor>& inputs) {
    gradients_at_recording.clear();
    for (const auto& group : stepped->param_groups()) {
      for (const auto& param : group.params()) {
        if (param.grad().defined()) gradients_at_recording.push_back(param.grad());
      }
    }
    static_inputs.clear();
    for (const at::Tensor& input : inputs) static_inputs.push_back(input.clone());
    const c10::Device device =
        static_inputs.empty() ? c10::Device(c10::kCUDA, c10::cuda::current_device()) : static_inputs.front().device();
    const c10::cuda::CUDAGuard device_guard(device);
    const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(device.index());
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
    at::cuda::CUDAEvent queued;
    queued.record(caller);
    queued.block(side);
    // The recording allocates from a pool of its own, and while a capture is
    // under way the caching allocator frees no cached block to make room: the
    // blocks the eager steps left cached (their activations) go back to the
    // device first, or a step that fits eagerly may not fit recorded
    // (LLaMA-2-7B on one H200: 33 GiB cached, out of memory while recording;
    // with the cache emptied, 23 GiB stayed reserved in segments partly in
    // use, which only expandable segments give back).
    c10::cuda::CUDACachingAllocator::emptyCache();
    graph = std::make_unique<at::cuda::CUDAGraph>();
    {
      const c10::cuda::CUDAStreamGuard stream_guard(side);
      graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      try {
        static_output = function(static_inputs).detach();
        // Ending can fail too: work forked onto another stream and never
        // joined, or out of memory while the graph is instantiated.
        graph->capture_end();
      } catch (const std::exception& error) {
        try {
          graph->capture_end();
        } catch (const std::exception&) {
          // The capture was invalidated; ending it is all that was needed.
        }
        graph.reset();
        static_inputs.clear();
        const bool out_of_memory = dynamic_cast<const c10::OutOfMemoryError*>(&error) != nullptr ||
                                   std::string(error.what()).find("out of memory") != std::string::npos;
        throw UsageError(fmt::format(
            "ddp::CapturedStep: the step could not be recorded into a CUDA graph: {}. {}", first_line_of(error),
            out_of_memory ? "The recorded step keeps its own memory for its activations beside the parameters, "
                            "gradients and optimizer state, and cannot use what the eager steps reserved in "
                            "segments still partly in use: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                            "(LLaMA-2-7B on one H200 records only so), lower the batch or sequence length, shard "
                            "(a DistributedDataParallel sharding mode), or run the step eagerly"
                          : "A recorded step must not wait for the GPU on the host: no .item() or copy to the "
                            "CPU, no find_unused_parameters without static_graph, no work forked onto another "
                            "stream and left unjoined; run such steps eagerly"));
      }
    }
    at::cuda::CUDAEvent recorded;
    recorded.record(side);
    recorded.block(caller);
  }
#endif
};

CapturedStep::CapturedStep(torch::optim::Optimizer& optimizer, Function function, CapturedStepOptions options)
    : impl_(std::make_unique<Impl>()) {
  if (options.warmup_steps() < 1) {
    throw UsageError(
        fmt::format("ddp::CapturedStep: warmup_steps is {}; at least one eager step must come first "
                    "(DistributedDataParallel settles its buckets after it)",
                    options.warmup_steps()));
  }
  impl_->stepped = &optimizer;
  impl_->optimizer = dynamic_cast<optim::CapturableOptimizer*>(&optimizer);
  if (impl_->optimizer == nullptr) {
    throw UsageError(
        "ddp::CapturedStep: this optimizer's step cannot be recorded (its learning rate and step "
        "counts would be frozen into the graph); use ddp::optim::FusedAdamW or ddp::optim::FusedSGD");
  }
  impl_->optimizer->set_capturable(true);
  impl_->function = std::move(function);
  impl_->options = std::move(options);
  if (const auto& group = impl_->options.process_group()) {
    impl_->watcher = dynamic_cast<detail::CommunicatorBase*>(&group->communicator());
  }
}

CapturedStep::~CapturedStep() = default;

at::Tensor CapturedStep::operator()(const std::vector<at::Tensor>& inputs) {
  Impl& impl = *impl_;
  impl.check_inputs(inputs);
  // Warm-up lasts until the optimizer has state for every parameter too: a
  // GradScaler may skip the first steps, and a recorded step must not create
  // state that every replay would create again.
  if (impl.eager_steps < impl.options.warmup_steps() || !impl.optimizer->has_state_for_every_gradient()) {
    ++impl.eager_steps;
    // Detached: a result that kept its autograd graph would keep that graph's
    // AccumulateGrad nodes alive, and DDP's reducer could not make the nodes
    // anew on the recording stream.
    return impl.function(inputs).detach();
  }
#ifdef DDP_WITH_CUDA
  if (!impl.graph) {
    impl.record(inputs);
  } else {
    for (std::size_t i = 0; i < inputs.size(); ++i) impl.static_inputs[i].copy_(inputs[i], /*non_blocking=*/true);
  }
  impl.optimizer->prepare_replay();
  impl.graph->replay();
  if (impl.watcher != nullptr) impl.watcher->watch_current_stream("captured step", "a replayed CUDA graph");
  return impl.static_output;
#else
  throw UsageError("ddp::CapturedStep: this libddp was built without CUDA; run the step eagerly");
#endif
}

void CapturedStep::reset() {
#ifdef DDP_WITH_CUDA
  impl_->graph.reset();
#endif
  impl_->static_inputs.clear();
  impl_->static_output = at::Tensor();
  impl_->gradients_at_recording.clear();
  impl_->eager_steps = 0;
}

bool CapturedStep::captured() const {
#ifdef DDP_WITH_CUDA
  return impl_->graph != nullptr;
#else
  return false;
#endif
}

}  // namespace ddp
