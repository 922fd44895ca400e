#pragma once

// DistributedDataParallel scenarios that hold on any backend. Each rank trains
// with DDP on its own batches and, beside it, a single-process reference that
// accumulates the gradients of every rank's batches; after K steps the
// parameters must agree. Each throws std::runtime_error on failure.

#include <memory>
#include <string>

#include <ddp/ddp.h>

namespace ddp::testing {

enum class Model {
  kMlp,         ///< two linear layers
  kConvBatchNorm,  ///< conv, BatchNorm (per-rank statistics), linear
  kBranchy,     ///< a head that some ranks skip on some steps
  /// an MLP whose output adds a parameter through a view: autograd hands that
  /// parameter a gradient sharing memory with the gradient the head still reads
  kViewedParameter,
};

struct Scenario {
  Model model = Model::kMlp;
  DistributedDataParallelOptions options;
  int steps = 3;
  int micro_steps = 1;      ///< > 1: the first micro_steps - 1 backward passes run under no_sync()
  double tolerance = 1e-5;  ///< max abs difference of any parameter
  bool channels_last = false;
  int width = 32;  ///< the MLPs' hidden width (wide: gradient buckets of megabytes)
  /// Module::load the weights after wrapping, as a resumed run does: LibTorch
  /// replaces the parameters' data (set_), and DDP must still reduce.
  bool load_after_wrapping = false;
};

/// Trains DDP and the reference side by side; returns the largest parameter
/// difference, and throws if it exceeds the tolerance.
double check_matches_single_process(ProcessGroup& pg, const Scenario& scenario,
                                    std::size_t* bucket_count = nullptr);

/// Rank 1 builds a different model: construction must fail on every rank
/// with a message naming the mismatch.
void check_model_mismatch_is_reported(ProcessGroup& pg);

/// A parameter that gets no gradient without find_unused_parameters: backward
/// must fail with its name and the fix.
void check_unused_parameter_is_reported(ProcessGroup& pg);

}  // namespace ddp::testing
