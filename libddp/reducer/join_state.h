#pragma once

#include <cstdint>

#include <ddp/distributed_data_parallel.h>

namespace ddp::detail {

/// What a DataParallelCore keeps while a ddp::Join exists.
struct DataParallelCore::JoinState {
  bool divide_by_initial_world_size = true;
  std::int64_t forwards = 0;  ///< This rank's forwards since the Join began.
};

}  // namespace ddp::detail
