#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include <ddp/export.h>

namespace ddp {

/// Base of every exception libddp throws.
class DDP_API Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Bad input from the user: environment variables, options, arguments.
/// The message names what was wrong and how to fix it.
class DDP_API UsageError : public Error {
 public:
  using Error::Error;
};

/// A collective failed or timed out. The message names the operation, its
/// sequence number, this rank, and what is known of the other ranks' progress.
class DDP_API CollectiveError : public Error {
 public:
  /// `message` is what what() returns; the other arguments are kept for the accessors.
  CollectiveError(std::string message, std::string operation, std::uint64_t sequence, int rank)
      : Error(std::move(message)), operation_(std::move(operation)), sequence_(sequence), rank_(rank) {}

  /// Name of the collective, e.g. "all_reduce".
  const std::string& operation() const { return operation_; }
  /// 1-based sequence number of the collective within its communicator.
  std::uint64_t sequence() const { return sequence_; }
  /// Rank that raised the error.
  int rank() const { return rank_; }

 private:
  std::string operation_;
  std::uint64_t sequence_;
  int rank_;
};

/// The first line of an exception's message, for one-line error reports:
/// LibTorch's errors (c10::Error) carry a backtrace after it, Gloo's their
/// context.
DDP_API std::string first_line_of(const std::exception& error);

}  // namespace ddp
