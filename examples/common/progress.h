#pragma once

// What a training run shows while it runs: a live progress line on rank 0
// (step, loss, throughput, ETA, peak memory) and a JSON-lines metrics log.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include <c10/core/Device.h>

namespace examples {

struct StepMetrics {
  std::int64_t step = 0;  ///< 1-based, after the optimizer step.
  double loss = 0;
  double learning_rate = 0;
  double items = 0;    ///< Images or tokens this step processed, over all ranks.
  double seconds = 0;  ///< Wall time of the step.
};

/// Peak memory of the run so far: allocated CUDA memory on a GPU, the
/// process's peak resident set on the CPU.
std::int64_t peak_memory_bytes(const c10::Device& device);

class Progress {
 public:
  /// unit: "img/s" or "tok/s". metrics_path: "" for none. Only rank 0 prints and writes.
  Progress(int rank, std::int64_t total_steps, std::string unit, const std::string& metrics_path,
           c10::Device device, std::int64_t print_every);
  ~Progress();

  void record(const StepMetrics& metrics);
  /// A line of its own (rank 0 only), e.g. validation results.
  void note(const std::string& line);
  /// Also written to the metrics log as {"event": ..., fields...}; `json_fields` is the inside of an object.
  void event(const std::string& name, const std::string& json_fields);

 private:
  bool active_;
  std::int64_t total_steps_;
  std::string unit_;
  c10::Device device_;
  std::int64_t print_every_;
  std::FILE* metrics_ = nullptr;
  bool live_line_;  // a terminal: rewrite one line instead of scrolling
  double recent_items_ = 0;
  double recent_seconds_ = 0;
  double average_step_seconds_ = 0;
};

}  // namespace examples
