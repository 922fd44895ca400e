#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace ddp::detail {

/// How far one rank got through its collectives.
struct Progress {
  std::uint64_t issued = 0;       ///< Sequence number of the last collective issued.
  std::string issued_op;          ///< Its name.
  std::uint64_t completed = 0;    ///< Sequence number of the last collective that finished.
  std::string completed_op;
  bool operator==(const Progress& other) const;
};

/// Each rank's progress, published in the rendezvous store so that a rank
/// whose collective fails can tell who is behind (the idea of PyTorch's
/// desync debugging).
class ProgressBoard {
 public:
  /// A new client of the same store (its own connection, so that a read
  /// left waiting holds no lock the other threads need).
  using Reconnect = std::function<c10::intrusive_ptr<c10d::Store>()>;

  /// `reconnect` (may be empty: the shared client serves) gives
  /// describe_peers(), and publish() once the shared client failed, a
  /// connection of its own that waits a few seconds for the store: a failing
  /// rank's report, and the watchdog that publishes, must not wait on a store
  /// whose server, rank 0, is stopped or hung.
  ProgressBoard(c10::intrusive_ptr<c10d::Store> store, std::string key_prefix, int rank, int world_size,
                Reconnect reconnect = nullptr);

  /// Publishes this rank's progress. Store failures are swallowed: progress
  /// reports are diagnostics and must never be the cause of an error. Once
  /// the store is gone (rank 0 exited) it publishes nothing more.
  void publish(const Progress& progress) noexcept;

  /// One line per other rank, saying how far it got relative to collective
  /// `sequence` (named `op`) of this rank. When `conclusive` (the collective
  /// timed out, so published progress is far fresher than the failure) it
  /// also names the ranks that are behind or diverged. When the store does
  /// not answer in time, it names rank 0, which serves it, as the suspect;
  /// when nothing serves it any more, it says that rank 0 has exited.
  std::string describe_peers(std::uint64_t sequence, const std::string& op, bool conclusive) const;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  std::string key_prefix_;
  int rank_;
  int world_size_;
  Reconnect reconnect_;
  c10::intrusive_ptr<c10d::Store> publisher_;  // store_ until it fails
  bool store_gone_ = false;
};

}  // namespace ddp::detail
