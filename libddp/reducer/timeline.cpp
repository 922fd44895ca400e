#include "reducer/timeline.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#ifdef DDP_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace ddp::detail {

using Clock = std::chrono::steady_clock;

#ifdef DDP_WITH_CUDA

namespace {

/// A point in device time, on the stream it was recorded on.
struct Marker {
  std::shared_ptr<at::cuda::CUDAEvent> event = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
  void record(const c10::cuda::CUDAStream& stream) { event->record(stream); }
  bool reached() const { return event->query(); }
  double ms_since(const Marker& origin) const { return origin.event->elapsed_time(*event); }
};

struct Collective {
  std::size_t bucket;
  std::size_t bytes;
  std::string name;
  Marker ready;  // its inputs are computed (caller's stream)
  Marker done;   // it finished (observed from a stream of our own)
};

struct Iteration {
  double host_start_us = 0;  // where the trace places the device origin
  Marker start;
  std::vector<Collective> collectives;
  Marker compute_end;
  bool closed = false;
};

}  // namespace

struct Timeline::Impl {
  c10::DeviceIndex device_index;
  int rank;
  std::string path;
  Clock::time_point created = Clock::now();
  c10::cuda::CUDAStream observer;
  std::mutex mutex;
  std::deque<Iteration> pending;  // not yet reached by the device
  std::vector<IterationTiming> resolved;
  std::string trace_events;

  Impl(c10::DeviceIndex index, int rank, std::string path)
      : device_index(index),
        rank(rank),
        path(std::move(path)),
        observer(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index)) {}

  c10::cuda::CUDAStream current() const { return c10::cuda::getCurrentCUDAStream(device_index); }

  void add_span(const char* track, const std::string& name, double start_us, double duration_us) {
    trace_events += fmt::format(
        "{}{{\"name\": \"{}\", \"ph\": \"X\", \"pid\": {}, \"tid\": \"{}\", \"ts\": {:.3f}, \"dur\": {:.3f}}}",
        trace_events.empty() ? "" : ",\n", name, rank, track, start_us, duration_us);
  }

  /// Turns the device times of the iterations the device has passed into
  /// timings and trace events. wait: also those it has not reached yet.
  void resolve(bool wait) {
    while (!pending.empty() && pending.front().closed) {
      Iteration& it = pending.front();
      // The end of backward and the last collective's end (the observer
      // stream runs them in order) may come either way round: a reduction
      // with nothing to do (one rank) ends before the compute does.
      std::vector<const Marker*> ends{&it.compute_end};
      if (!it.collectives.empty()) ends.push_back(&it.collectives.back().done);
      if (wait) {
        for (const Marker* end : ends) end->event->synchronize();
      }
      if (!std::all_of(ends.begin(), ends.end(), [](const Marker* end) { return end->reached(); })) break;
      IterationTiming timing;
      timing.backward_ms = it.compute_end.ms_since(it.start);
      double previous_end = 0;
      for (const Collective& c : it.collectives) {
        // One stream runs the collectives in order: each starts when its
        // inputs are ready and the one before it has finished.
        const double ready = c.ready.ms_since(it.start);
        const double start = std::max(ready, previous_end);
        const double end = c.done.ms_since(it.start);
        timing.communication_ms += end - start;
        previous_end = end;
        add_span("device: gradients ready", fmt::format("bucket {} ready", c.bucket), it.host_start_us + ready * 1e3, 1);
        add_span("device: communication", fmt::format("bucket {} {} ({:.2f} MiB)", c.bucket, c.name, c.bytes / 1048576.0),
                 it.host_start_us + start * 1e3, (end - start) * 1e3);
      }
      timing.exposed_communication_ms = std::max(0.0, previous_end - timing.backward_ms);
      add_span("device: backward", fmt::format("backward {}", resolved.size()), it.host_start_us,
               timing.backward_ms * 1e3);
      if (timing.exposed_communication_ms > 0) {
        add_span("device: backward", "exposed communication", it.host_start_us + timing.backward_ms * 1e3,
                 timing.exposed_communication_ms * 1e3);
      }
      resolved.push_back(timing);
      pending.pop_front();
    }
  }
};

namespace {

/// Forwards to the real communicator; marks each collective's ready and done.
class ObservingCommunicator final : public Communicator {
 public:
  ObservingCommunicator(Communicator& inner, Timeline::Impl& timeline, Iteration& iteration, std::size_t bucket,
                        std::size_t bytes)
      : inner_(inner), timeline_(timeline), iteration_(iteration), bucket_(bucket), bytes_(bytes) {}

  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  Backend backend() const override { return inner_.backend(); }
  c10::Device device() const override { return inner_.device(); }
  std::chrono::milliseconds timeout() const override { return inner_.timeout(); }

  std::shared_ptr<Work> all_reduce(const at::Tensor& tensor, ReduceOp op) override {
    return observed("all_reduce", [&] { return inner_.all_reduce(tensor, op); });
  }
  std::shared_ptr<Work> broadcast(const at::Tensor& tensor, int root) override {
    return observed("broadcast", [&] { return inner_.broadcast(tensor, root); });
  }
  std::shared_ptr<Work> all_gather(const at::Tensor& output, const at::Tensor& input) override {
    return observed("all_gather", [&] { return inner_.all_gather(output, input); });
  }
  std::shared_ptr<Work> reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) override {
    return observed("reduce_scatter", [&] { return inner_.reduce_scatter(output, input, op); });
  }
  void barrier() override { inner_.barrier(); }

 private:
  template <typename Launch>
  std::shared_ptr<Work> observed(const char* name, Launch&& launch) {
    Collective collective{bucket_, bytes_, name, {}, {}};
    collective.ready.record(timeline_.current());
    auto work = launch();
    {
      // Our own stream waits for the collective and marks its end; the
      // caller's stream is not held back.
      c10::cuda::CUDAStreamGuard guard(timeline_.observer);
      work->wait_stream();
      collective.done.record(timeline_.observer);
    }
    std::lock_guard<std::mutex> lock(timeline_.mutex);
    iteration_.collectives.push_back(std::move(collective));
    return work;
  }

  Communicator& inner_;
  Timeline::Impl& timeline_;
  Iteration& iteration_;
  std::size_t bucket_;
  std::size_t bytes_;
};

}  // namespace

Timeline::Timeline(c10::Device device, int rank, std::string path) {
  if (device.is_cuda()) impl_ = std::make_unique<Impl>(device.index(), rank, std::move(path));
}

Timeline::~Timeline() {
  if (!impl_ || impl_->path.empty()) return;
  try {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->resolve(/*wait=*/true);
    std::ofstream out(impl_->path);
    out << "{\"traceEvents\": [\n" << impl_->trace_events << "\n], \"displayTimeUnit\": \"ms\"}\n";
    if (!out) std::fprintf(stderr, "libddp: could not write the DDP timeline to '%s'\n", impl_->path.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "libddp: could not write the DDP timeline to '%s': %s\n", impl_->path.c_str(), e.what());
  }
}

void Timeline::begin_backward() {
  if (!impl_) return;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  // A forward whose backward never ran left an iteration open: forget it.
  if (!impl_->pending.empty() && !impl_->pending.back().closed) impl_->pending.pop_back();
  impl_->resolve(/*wait=*/false);
  Iteration iteration;
  iteration.host_start_us = std::chrono::duration<double, std::micro>(Clock::now() - impl_->created).count();
  iteration.start.record(impl_->current());
  impl_->pending.push_back(std::move(iteration));
}

std::unique_ptr<Communicator> Timeline::observe(Communicator& comm, std::size_t bucket, std::size_t bytes) {
  if (!impl_ || impl_->pending.empty() || impl_->pending.back().closed) return nullptr;
  return std::make_unique<ObservingCommunicator>(comm, *impl_, impl_->pending.back(), bucket, bytes);
}

void Timeline::end_backward_compute() {
  if (!impl_) return;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->pending.empty() || impl_->pending.back().closed) return;
  impl_->pending.back().compute_end.record(impl_->current());
  impl_->pending.back().closed = true;
}

std::vector<IterationTiming> Timeline::timings() {
  if (!impl_) return {};
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->resolve(/*wait=*/true);
  return impl_->resolved;
}

#else  // no CUDA: the CPU backends have no device time to record

struct Timeline::Impl {};
Timeline::Timeline(c10::Device, int, std::string path) {
  if (!path.empty()) std::fprintf(stderr, "libddp: the DDP timeline records GPU runs only; '%s' will not be written\n", path.c_str());
}
Timeline::~Timeline() = default;
void Timeline::begin_backward() {}
std::unique_ptr<Communicator> Timeline::observe(Communicator&, std::size_t, std::size_t) { return nullptr; }
void Timeline::end_backward_compute() {}
std::vector<IterationTiming> Timeline::timings() { return {}; }

#endif

}  // namespace ddp::detail
