#pragma once

#include <memory>

#include "comm/communicator_base.h"

// Factories of the communication backends this build has. Each is defined
// only when its backend is compiled in (DDP_WITH_GLOO / DDP_WITH_NCCL).

namespace ddp::detail {

/// Gloo on the CPU, through LibTorch's c10d ProcessGroupGloo.
std::shared_ptr<Communicator> make_gloo_communicator(CommunicatorBase::Setup setup);

/// NCCL on cuda:`device_index`, which becomes the process's current device.
std::shared_ptr<Communicator> make_nccl_communicator(CommunicatorBase::Setup setup, int device_index);

}  // namespace ddp::detail
