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

/// What the steps since the last report did.
struct StepMetrics {
  std::int64_t step = 0;   ///< Optimizer steps done (1-based).
  std::int64_t steps = 1;  ///< Steps since the last report.
  double loss = 0;         ///< Of the last step, averaged over ranks.
  double learning_rate = 0;
  double items = 0;    ///< Images or tokens those steps processed, over all ranks.
  double seconds = 0;  ///< Their wall time.
};

/// Peak memory of the run so far: allocated CUDA memory on a GPU, the
/// process's peak resident set on the CPU.
std::int64_t peak_memory_bytes(const c10::Device& device);

class Progress {
 public:
  /// unit: "img/s" or "tok/s". metrics_path: "" for none; a run that
  /// resumes appends to it (after a "resume" event), any other starts it
  /// anew. Only rank 0 prints and writes.
  Progress(int rank, std::int64_t total_steps, std::string unit, const std::string& metrics_path, bool resuming,
           c10::Device device);
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
  std::FILE* metrics_ = nullptr;
  bool live_line_;  // a terminal: rewrite one line instead of scrolling
  double average_step_seconds_ = 0;
};

}  // namespace examples
