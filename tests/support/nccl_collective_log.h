#pragma once
// NCCL's own record of the collectives it ran in this process: the proof
// that a collective went to the copy engines is that NCCL never saw it.

#include <cstdint>

#include "support/multiprocess.h"

namespace ddp::testing {

/// Run options that make NCCL log every collective it launches
/// (NCCL_DEBUG_SUBSYS=COLL) into a file per process.
RunOptions nccl_logging_collectives();

/// The all-reduces, reduce-scatters and all-gathers NCCL logged in this process so far:
/// how many, and how many of them moved at least `large_bytes` in all (a reduce-scatter's
/// input, an all-gather's output), in all and of the sharded modes' two kinds.
struct NcclLoggedCollectives {
  int count = 0;
  int large = 0;
  int large_reduce_scatters = 0;
  int large_all_gathers = 0;
};
NcclLoggedCollectives nccl_logged_collectives(std::int64_t large_bytes = 512 << 10);

}  // namespace ddp::testing
