#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include <ddp/distributed_data_parallel.h>
#include <ddp/join.h>

#include "sharding/sharded_parameters.h"

namespace ddp::detail {

/// The kinds of forward the ranks agree on under a ddp::Join, each with its
/// own collectives.
enum JoinForwardKind { kEvaluationForward, kNoSyncForward, kSynchronisedForward, kJoinForwardKinds };

/// What a DataParallelCore keeps while a ddp::Join exists.
struct DataParallelCore::JoinState {
  JoinOptions options;
  std::int64_t forwards = 0;  ///< This rank's forwards since the Join began.
  /// Sharding::kFull: the unit gathers and reductions of this rank's last
  /// forward of each kind (with its backward), repeated by done().
  std::array<std::optional<std::vector<ShardedCollective>>, kJoinForwardKinds> collectives;
  std::vector<ShardedCollective> recording;  ///< Of the forward running now.
  int recording_kind = -1;                   ///< Its kind; -1: none.
};

}  // namespace ddp::detail
