#pragma once

#include <ddp/errors.h>

namespace ddp::detail {

/// The job's rendezvous store stopped serving: nothing listens at its
/// address (any more), or its server closed or reset the connection. Rank 0
/// serves it, so rank 0 has exited or shut down its process group, where a
/// store that accepts but does not answer means rank 0 is stopped or hung. The store's client throws it; a
/// failing rank's report tells the two apart.
class StoreServerGone : public Error {
 public:
  using Error::Error;
};

}  // namespace ddp::detail
