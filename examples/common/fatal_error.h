#pragma once

// How the training programs end on an exception.

#include <exception>

namespace examples {

/// Prints why `program` stops, as "PROGRAM: error: REASON" on stderr, and
/// returns its exit status: 2 for bad input (ddp::UsageError), 1 otherwise.
/// LibTorch's own errors (a CUDA out-of-memory, a failed check) carry a C++
/// backtrace in what(); it is left out, so that the user and ddprun's failure
/// summary see the reason rather than stack frames.
int report_fatal_error(const char* program, const std::exception& error);

}  // namespace examples
