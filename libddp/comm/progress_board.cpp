#include "comm/progress_board.h"

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <ddp/errors.h>

#include "comm/store_server_gone.h"

namespace ddp::detail {
namespace {

/// How long a failing rank's report waits for the other ranks' records.
constexpr std::chrono::seconds kReportDeadline{5};

std::string encode(const Progress& p) {
  return fmt::format("{} {} {} {}", p.issued, p.issued_op.empty() ? "-" : p.issued_op, p.completed,
                     p.completed_op.empty() ? "-" : p.completed_op);
}

bool decode(const std::string& text, Progress& p) {
  std::istringstream in(text);
  return static_cast<bool>(in >> p.issued >> p.issued_op >> p.completed >> p.completed_op);
}

}  // namespace

bool Progress::operator==(const Progress& other) const {
  return issued == other.issued && completed == other.completed && issued_op == other.issued_op &&
         completed_op == other.completed_op;
}

ProgressBoard::ProgressBoard(c10::intrusive_ptr<c10d::Store> store, std::string key_prefix, int rank, int world_size,
                             Reconnect reconnect)
    : store_(std::move(store)),
      key_prefix_(std::move(key_prefix)),
      rank_(rank),
      world_size_(world_size),
      reconnect_(std::move(reconnect)),
      publisher_(store_) {}

void ProgressBoard::publish(const Progress& progress) noexcept {
  if (store_gone_) return;
  try {
    if (!publisher_) publisher_ = reconnect_ ? reconnect_() : store_;
    const std::string value = encode(progress);
    publisher_->set(key_prefix_ + std::to_string(rank_), std::vector<uint8_t>(value.begin(), value.end()));
  } catch (const StoreServerGone&) {
    // Rank 0 does not come back: each later try would wait out the
    // connection's timeout, and the watchdog, which checks the collectives'
    // deadlines between publishes, with it.
    store_gone_ = true;
  } catch (...) {
    // The shared client reconnects with the rendezvous timeout, which a
    // stopped rank 0 would cost the watchdog.
    publisher_.reset();
  }
}

std::string ProgressBoard::describe_peers(std::uint64_t sequence, const std::string& op, bool conclusive) const {
  // The records are read on a thread of their own, through a connection of
  // their own, so that a store that never answers (its server, rank 0, is
  // stopped) costs this report at most kReportDeadline: that thread is then
  // left blocked on its private connection, and the process is ending anyway.
  using Records = std::vector<std::optional<std::string>>;  // per rank; nullopt: none published
  auto promise = std::make_shared<std::promise<Records>>();
  std::future<Records> future = promise->get_future();
  std::thread([promise, store = store_, reconnect = reconnect_, prefix = key_prefix_, rank = rank_,
               world_size = world_size_]() mutable {
    try {
      if (reconnect) store = reconnect();
      Records records(static_cast<std::size_t>(world_size));
      for (int peer = 0; peer < world_size; ++peer) {
        const std::string key = prefix + std::to_string(peer);
        if (peer == rank || !store->check({key})) continue;
        const auto bytes = store->get(key);
        records[static_cast<std::size_t>(peer)] = std::string(bytes.begin(), bytes.end());
      }
      promise->set_value(std::move(records));
    } catch (...) {
      promise->set_exception(std::current_exception());
    }
  }).detach();
  Records records;
  try {
    if (future.wait_for(kReportDeadline) != std::future_status::ready) {
      throw std::runtime_error(fmt::format("no answer within {} s", kReportDeadline.count()));
    }
    records = future.get();
  } catch (const StoreServerGone& e) {
    return fmt::format(
        "\n  the rendezvous store, which rank 0 serves at MASTER_ADDR:MASTER_PORT, is gone: rank 0 has exited or "
        "shut down its process group (it failed, finished or returned early, or left after another rank's "
        "failure), so the other ranks' progress cannot be read here; rank 0's output says which ({})",
        first_line_of(e));
  } catch (const std::exception& e) {
    return fmt::format(
        "\n  the rendezvous store, which rank 0 serves at MASTER_ADDR:MASTER_PORT, did not answer: rank 0 is "
        "stopped or hung, and is the suspect ({})",
        first_line_of(e));
  }
  std::string lines;
  std::vector<int> behind;
  std::vector<int> diverged;
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer == rank_) continue;
    const std::optional<std::string>& record = records[static_cast<std::size_t>(peer)];
    Progress p;
    if (!record) {
      lines += fmt::format("\n  rank {}: published no progress (it issued no collective yet)", peer);
      behind.push_back(peer);
      continue;
    }
    if (!decode(*record, p)) {
      lines += fmt::format("\n  rank {}: unreadable progress record", peer);
      continue;
    }
    lines += fmt::format("\n  rank {}: issued #{} ({}), completed #{} ({})", peer, p.issued, p.issued_op,
                         p.completed, p.completed_op);
    if (p.issued < sequence) {
      behind.push_back(peer);
    } else if (p.issued == sequence && p.issued_op != op) {
      diverged.push_back(peer);
    }
  }
  if (!conclusive) {
    return lines + "\n  (as last published; a rank's record may lag its progress by a fraction of a second)";
  }
  if (!behind.empty()) {
    lines += fmt::format("\n  rank(s) {} have not issued #{} ({}): they are stuck, crashed or slower by more "
                         "than the timeout",
                         fmt::join(behind, ", "), sequence, op);
  }
  if (!diverged.empty()) {
    lines += fmt::format("\n  rank(s) {} issued a different collective as #{}: the ranks call collectives in "
                         "different orders",
                         fmt::join(diverged, ", "), sequence);
  }
  return lines;
}

}  // namespace ddp::detail
