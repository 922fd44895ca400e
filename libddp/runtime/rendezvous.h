#pragma once

#include <chrono>

#include <c10/util/intrusive_ptr.h>

#include <ddp/environment.h>

namespace c10d {
class Store;
}

namespace ddp::detail {

/// Rank 0 serves the job's store (StoreServer); every rank connects to it,
/// presenting the job's run id (TORCHELASTIC_RUN_ID) and secret
/// (DDP_RDZV_TOKEN), then waits until all WORLD_SIZE ranks have checked in,
/// all within `timeout`. Where every rank runs on this node and MASTER_ADDR
/// is a loopback address (ddprun --standalone), the store listens on that
/// address only, so that no other machine can reach it; a job across nodes
/// must have a token.
c10::intrusive_ptr<c10d::Store> rendezvous(const Environment& env, std::chrono::milliseconds timeout);

/// Whether `host` resolves to loopback addresses only (127.0.0.0/8, ::1).
bool is_loopback_host(const std::string& host);

}  // namespace ddp::detail
