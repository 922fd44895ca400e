#pragma once

#include <cstdint>

#include <ddp/distributed_data_parallel.h>
#include <ddp/join.h>

namespace ddp::detail {

/// The kinds of forward the ranks agree on under a ddp::Join, each with its
/// own collectives.
enum JoinForwardKind { kEvaluationForward, kNoSyncForward, kSynchronisedForward, kJoinForwardKinds };

inline JoinForwardKind join_forward_kind(bool grad, bool sync) {
  if (!grad) return kEvaluationForward;
  return sync ? kSynchronisedForward : kNoSyncForward;
}

/// What a DataParallelCore keeps while a ddp::Join exists.
struct DataParallelCore::JoinState {
  JoinOptions options;
  std::int64_t forwards = 0;  ///< This rank's forwards since the Join began.
};

}  // namespace ddp::detail
