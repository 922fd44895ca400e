#pragma once

#include <chrono>

#include <c10/util/intrusive_ptr.h>

#include <ddp/environment.h>

namespace c10d {
class Store;
}

namespace ddp::detail {

/// Every rank connects to rank 0's TCP store, then waits until all
/// WORLD_SIZE ranks of this job (TORCHELASTIC_RUN_ID) have checked in, all
/// within `timeout`. Where every rank runs on this node and MASTER_ADDR is
/// a loopback address (ddprun --standalone), rank 0's store listens on that
/// address only, so that no other machine can reach it (LibTorch >= 2.4;
/// 1.13's TCPStore binds every interface itself).
c10::intrusive_ptr<c10d::Store> rendezvous(const Environment& env, std::chrono::milliseconds timeout);

/// Whether `host` resolves to loopback addresses only (127.0.0.0/8, ::1).
bool is_loopback_host(const std::string& host);

}  // namespace ddp::detail
