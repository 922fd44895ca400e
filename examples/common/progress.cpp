#include "progress.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#ifdef EXAMPLES_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace examples {

std::int64_t peak_memory_bytes(const c10::Device& device) {
#ifdef EXAMPLES_WITH_CUDA
  if (device.is_cuda()) {
    // Index 0 is the aggregate over pool types in every LibTorch version.
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].peak;
  }
#endif
  (void)device;
  rusage usage{};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

namespace {

std::string duration(double seconds) {
  const auto total = static_cast<std::int64_t>(seconds + 0.5);
  if (total >= 3600) return fmt::format("{}h{:02}m", total / 3600, total % 3600 / 60);
  if (total >= 60) return fmt::format("{}m{:02}s", total / 60, total % 60);
  return fmt::format("{}s", total);
}

}  // namespace

Progress::Progress(int rank, std::int64_t total_steps, std::string unit, const std::string& metrics_path,
                   bool resuming, c10::Device device)
    : active_(rank == 0),
      total_steps_(total_steps),
      unit_(std::move(unit)),
      device_(device),
      live_line_(::isatty(STDOUT_FILENO) == 1) {
  if (active_ && !metrics_path.empty()) {
    metrics_ = std::fopen(metrics_path.c_str(), resuming ? "a" : "w");
    if (metrics_ == nullptr) {
      throw std::runtime_error(fmt::format("cannot open the metrics log '{}': {}", metrics_path, std::strerror(errno)));
    }
  }
}

Progress::~Progress() {
  if (live_line_ && active_) std::printf("\n");
  if (metrics_ != nullptr) std::fclose(metrics_);
}

void Progress::record(const StepMetrics& m) {
  if (!active_) return;
  const double step_seconds = m.seconds / static_cast<double>(std::max<std::int64_t>(1, m.steps));
  // The first steps include warm-up (cuDNN autotuning, allocator growth):
  // an exponential average lets the ETA forget them.
  average_step_seconds_ = average_step_seconds_ == 0 ? step_seconds : 0.7 * average_step_seconds_ + 0.3 * step_seconds;
  const double throughput = m.seconds > 0 ? m.items / m.seconds : 0;
  const double peak_gib = static_cast<double>(peak_memory_bytes(device_)) / (1 << 30);
  if (metrics_ != nullptr) {
    std::fprintf(metrics_,
                 "{\"step\": %lld, \"loss\": %.6f, \"lr\": %.6g, \"step_seconds\": %.6f, \"throughput\": %.2f, "
                 "\"peak_memory_gib\": %.3f}\n",
                 static_cast<long long>(m.step), m.loss, m.learning_rate, step_seconds, throughput, peak_gib);
    std::fflush(metrics_);
  }
  const std::string line =
      fmt::format("step {}/{} | loss {:.4f} | lr {:.3g} | {:.0f} {} | ETA {} | peak mem {:.2f} GiB", m.step,
                  total_steps_, m.loss, m.learning_rate, throughput, unit_,
                  duration(average_step_seconds_ * static_cast<double>(total_steps_ - m.step)), peak_gib);
  if (live_line_) {
    std::printf("\r\033[K%s", line.c_str());
  } else {
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);
}

void Progress::note(const std::string& line) {
  if (!active_) return;
  std::printf(live_line_ ? "\r\033[K%s\n" : "%s\n", line.c_str());
  std::fflush(stdout);
}

void Progress::event(const std::string& name, const std::string& json_fields) {
  if (!active_ || metrics_ == nullptr) return;
  std::fprintf(metrics_, "{\"event\": \"%s\", %s}\n", name.c_str(), json_fields.c_str());
  std::fflush(metrics_);
}

}  // namespace examples
