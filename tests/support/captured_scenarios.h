#pragma once

// ddp::CapturedStep against the same step run eagerly.

#include <memory>

#include <ddp/ddp.h>

namespace ddp::testing {

/// Two copies of one MLP under DistributedDataParallel on `pg`, one stepped
/// eagerly and one through a CapturedStep (FusedAdamW, a learning rate that
/// changes every step), on this rank's batches for `steps` steps: warm-up,
/// the recording, replays. Returns the largest difference of any parameter
/// and of any step's loss; throws std::runtime_error past `tolerance`.
double check_captured_step_matches_eager(const std::shared_ptr<ProcessGroup>& pg, int steps, double tolerance);

}  // namespace ddp::testing
