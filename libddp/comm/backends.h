#pragma once

#include <memory>

#include "comm/communicator_base.h"

// Factories of the communication backends this build has. Each is defined
// only when its backend is compiled in (DDP_WITH_GLOO / DDP_WITH_NCCL).

namespace ddp::detail {

/// Gloo on the CPU, through LibTorch's c10d ProcessGroupGloo.
std::shared_ptr<Communicator> make_gloo_communicator(CommunicatorBase::Setup setup);

/// NCCL on cuda:`device_index`, which becomes the process's current device;
/// with `copy_engine_reductions`, large floating-point all-reduces take the
/// copy engines instead (comm/copy_engine_reduction.h).
std::shared_ptr<Communicator> make_nccl_communicator(CommunicatorBase::Setup setup, int device_index,
                                                     bool copy_engine_reductions);

}  // namespace ddp::detail
