#include "comm/progress_board.h"

#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace ddp::detail {
namespace {

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

ProgressBoard::ProgressBoard(c10::intrusive_ptr<c10d::Store> store, std::string key_prefix, int rank,
                             int world_size)
    : store_(std::move(store)), key_prefix_(std::move(key_prefix)), rank_(rank), world_size_(world_size) {}

void ProgressBoard::publish(const Progress& progress) noexcept {
  try {
    const std::string value = encode(progress);
    store_->set(key_prefix_ + std::to_string(rank_), std::vector<uint8_t>(value.begin(), value.end()));
  } catch (...) {
  }
}

std::string ProgressBoard::describe_peers(std::uint64_t sequence, const std::string& op, bool conclusive) const {
  std::string lines;
  std::vector<int> behind;
  std::vector<int> diverged;
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer == rank_) continue;
    const std::string key = key_prefix_ + std::to_string(peer);
    Progress p;
    try {
      if (!store_->check({key})) {
        lines += fmt::format("\n  rank {}: published no progress (it issued no collective yet)", peer);
        behind.push_back(peer);
        continue;
      }
      const auto bytes = store_->get(key);
      if (!decode(std::string(bytes.begin(), bytes.end()), p)) {
        lines += fmt::format("\n  rank {}: unreadable progress record", peer);
        continue;
      }
    } catch (const std::exception& e) {
      return fmt::format(
          "\n  the other ranks' progress is unknown: the rendezvous store (served by rank 0 at "
          "MASTER_ADDR:MASTER_PORT) did not answer, so rank 0 has probably exited ({})",
          e.what());
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
