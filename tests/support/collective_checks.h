#pragma once

// Checks of every collective that hold for any backend; the Gloo (CPU) and
// NCCL (GPU) suites run the same ones. Each throws std::runtime_error with
// what went wrong, so it can run inside a rank's process.

#include <cstdint>
#include <functional>
#include <string>

#include <c10/core/ScalarType.h>

#include <ddp/communicator.h>

namespace ddp::testing {

/// Rank r contributes (i % 17) + r + 1 at element i; every rank checks the
/// reduced result against the closed form.
void check_all_reduce(Communicator& comm, c10::ScalarType dtype, std::int64_t numel, ReduceOp op);
void check_broadcast(Communicator& comm, c10::ScalarType dtype, std::int64_t numel, int root);
void check_all_gather(Communicator& comm, c10::ScalarType dtype, std::int64_t numel);
/// Rank r contributes (i % 17) + r + 1 at element i of world_size x numel;
/// each rank checks its part of the reduction, into a tensor of its own and in
/// place; with an `output_dtype` other than `dtype` (fp32 from 16 bits), into
/// a tensor of that dtype only, to its precision (every value is exact in 16 bits).
void check_reduce_scatter(Communicator& comm, c10::ScalarType dtype, std::int64_t numel, ReduceOp op,
                          c10::ScalarType output_dtype = c10::ScalarType::Undefined);
/// all_gather whose input is this rank's part of the output.
void check_all_gather_in_place(Communicator& comm, std::int64_t numel);
/// Several collectives in flight at once, waited for in reverse order.
void check_many_in_flight(Communicator& comm);
/// Non-contiguous tensors, avg of integers, wrong all_gather and reduce_scatter sizes and a bad
/// root are refused with a UsageError, and the communicator stays usable.
void check_usage_errors(Communicator& comm);

/// Runs `body`, which must throw a CollectiveError, and returns its message.
std::string collective_error_of(const std::function<void()>& body);
/// Throws unless `text` contains `part`.
void require_contains(const std::string& text, const std::string& part);

/// Throws unless `call` raises a one-line ddp::UsageError containing `part`.
void require_usage_error(const std::function<void()>& call, const std::string& part);

}  // namespace ddp::testing
