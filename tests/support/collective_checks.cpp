#include "support/collective_checks.h"

#include <cmath>
#include <vector>

#include <torch/torch.h>

#include <ddp/errors.h>

#include "support/multiprocess.h"

namespace ddp::testing {
namespace {

double tolerance(c10::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble: return 1e-12;
    case at::kFloat: return 1e-6;
    case at::kBFloat16: return 1e-2;
    case at::kHalf: return 1e-3;
    default: return 0;
  }
}

/// Relative comparison in float64 on the CPU; `what` names the check.
void require_close(const at::Tensor& got, const at::Tensor& expected, c10::ScalarType dtype, const std::string& what) {
  require(got.numel() == expected.numel(), what + ": wrong number of elements");
  if (got.numel() == 0) return;
  const at::Tensor g = got.to(at::kDouble).cpu().flatten();
  const at::Tensor e = expected.to(at::kDouble).flatten();
  const double error = ((g - e).abs() / e.abs().clamp_min(1.0)).max().item<double>();
  require(error <= tolerance(dtype), what + ": max relative error " + std::to_string(error) + " exceeds " +
                                         std::to_string(tolerance(dtype)));
}

std::string name_of(c10::ScalarType dtype, std::int64_t numel) {
  return std::string(c10::toString(dtype)) + "[" + std::to_string(numel) + "]";
}

at::Tensor pattern(std::int64_t numel) { return at::arange(numel, at::kLong).remainder(17).to(at::kDouble); }

}  // namespace

void check_all_reduce(Communicator& comm, c10::ScalarType dtype, std::int64_t numel, ReduceOp op) {
  const double rank = comm.rank();
  const double world = comm.world_size();
  const at::Tensor index = pattern(numel);
  at::Tensor tensor = (index + rank + 1).to(at::TensorOptions().dtype(dtype).device(comm.device()));
  comm.all_reduce(tensor, op)->wait();
  const at::Tensor sum = index * world + world * (world + 1) / 2;
  const at::Tensor expected = op == ReduceOp::kSum ? sum : op == ReduceOp::kAvg ? sum / world : index + world;
  require_close(tensor, expected, dtype, "all_reduce " + to_string(op) + " of " + name_of(dtype, numel));
}

void check_broadcast(Communicator& comm, c10::ScalarType dtype, std::int64_t numel, int root) {
  const at::Tensor expected = pattern(numel) * 3 + 7 + root;
  at::Tensor tensor = comm.rank() == root ? expected.clone() : at::full({numel}, -1.0, at::kDouble);
  tensor = tensor.to(at::TensorOptions().dtype(dtype).device(comm.device()));
  comm.broadcast(tensor, root)->wait();
  require_close(tensor, expected, dtype,
                "broadcast from " + std::to_string(root) + " of " + name_of(dtype, numel));
}

void check_all_gather(Communicator& comm, c10::ScalarType dtype, std::int64_t numel) {
  const auto options = at::TensorOptions().dtype(dtype).device(comm.device());
  const at::Tensor input = (pattern(numel) + 100 * comm.rank()).to(options);
  at::Tensor output = at::full({comm.world_size() * numel}, 255.0, options);  // no rank sends it; bytes hold it
  comm.all_gather(output, input)->wait();
  std::vector<at::Tensor> parts;
  for (int r = 0; r < comm.world_size(); ++r) parts.push_back(pattern(numel) + 100 * r);
  require_close(output, at::cat(parts), dtype, "all_gather of " + name_of(dtype, numel));
}

void check_reduce_scatter(Communicator& comm, c10::ScalarType dtype, std::int64_t numel, ReduceOp op,
                          c10::ScalarType output_dtype) {
  const double rank = comm.rank();
  const double world = comm.world_size();
  const auto options = at::TensorOptions().dtype(dtype).device(comm.device());
  const at::Tensor index = pattern(comm.world_size() * numel);
  const at::Tensor sum = index * world + world * (world + 1) / 2;
  const at::Tensor whole = op == ReduceOp::kSum ? sum : op == ReduceOp::kAvg ? sum / world : index + world;
  const at::Tensor expected = whole.narrow(0, comm.rank() * numel, numel);
  const std::string what = "reduce_scatter " + to_string(op) + " of " + name_of(dtype, numel);

  at::Tensor input = (index + rank + 1).to(options);
  if (output_dtype != c10::ScalarType::Undefined && output_dtype != dtype) {
    at::Tensor output = at::full({numel}, -1.0, options.dtype(output_dtype));
    comm.reduce_scatter(output, input, op)->wait();
    require_close(output, expected, output_dtype, what + " into " + c10::toString(output_dtype));
    return;
  }
  at::Tensor output = at::full({numel}, -1.0, options);
  comm.reduce_scatter(output, input, op)->wait();
  require_close(output, expected, dtype, what);
  at::Tensor in_place = (index + rank + 1).to(options);
  comm.reduce_scatter(in_place.narrow(0, comm.rank() * numel, numel), in_place, op)->wait();
  require_close(in_place.narrow(0, comm.rank() * numel, numel), expected, dtype, what + " in place");
}

void check_all_gather_in_place(Communicator& comm, std::int64_t numel) {
  const auto options = at::TensorOptions().dtype(at::kFloat).device(comm.device());
  at::Tensor output = at::full({comm.world_size() * numel}, -1.0, options);
  at::Tensor mine = output.narrow(0, comm.rank() * numel, numel);
  mine.copy_(pattern(numel) + 100 * comm.rank());
  comm.all_gather(output, mine)->wait();
  std::vector<at::Tensor> parts;
  for (int r = 0; r < comm.world_size(); ++r) parts.push_back(pattern(numel) + 100 * r);
  require_close(output, at::cat(parts), at::kFloat, "all_gather in place of " + name_of(at::kFloat, numel));
}

void check_many_in_flight(Communicator& comm) {
  const auto options = at::TensorOptions().dtype(at::kFloat).device(comm.device());
  std::vector<at::Tensor> tensors;
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < 8; ++i) {
    tensors.push_back(at::full({1000 * (i + 1)}, static_cast<double>(comm.rank() + i), options));
    works.push_back(comm.all_reduce(tensors.back(), ReduceOp::kSum));
  }
  for (int i = 7; i >= 0; --i) works[static_cast<size_t>(i)]->wait();
  const double world = comm.world_size();
  for (int i = 0; i < 8; ++i) {
    const double expected = world * (world - 1) / 2 + world * i;
    require_close(tensors[static_cast<size_t>(i)], at::full({1000 * (i + 1)}, expected, at::kDouble), at::kFloat,
                  "in-flight all_reduce " + std::to_string(i));
    require(works[static_cast<size_t>(i)]->is_completed(), "a waited work is not completed");
  }
}

void require_usage_error(const std::function<void()>& call, const std::string& part) {
  try {
    call();
  } catch (const UsageError& e) {
    require_contains(e.what(), part);
    require(std::string(e.what()).find('\n') == std::string::npos, std::string("not one line: ") + e.what());
    return;
  }
  throw std::runtime_error("expected a UsageError containing '" + part + "'");
}

void check_usage_errors(Communicator& comm) {
  const auto options = at::TensorOptions().device(comm.device());
  const auto& refused = require_usage_error;
  refused([&] { comm.all_reduce(at::ones({4, 3}, options).t()); }, "not contiguous");
  refused([&] { comm.all_reduce(at::ones({4}, options.dtype(at::kLong)), ReduceOp::kAvg); }, "avg needs a floating");
  refused([&] { comm.all_gather(at::ones({3}, options), at::ones({2}, options)); }, "world_size");
  refused([&] { comm.reduce_scatter(at::ones({2}, options), at::ones({2 * comm.world_size() + 1}, options)); },
          "world_size");
  refused([&] {
    comm.reduce_scatter(at::ones({1}, options.dtype(at::kInt)), at::ones({comm.world_size()}, options.dtype(at::kInt)),
                        ReduceOp::kAvg);
  }, "avg needs a floating");
  // Only 16 bits into fp32 may change the dtype, not fp32 into 16 bits.
  refused(
      [&] { comm.reduce_scatter(at::ones({1}, options.dtype(at::kBFloat16)), at::ones({comm.world_size()}, options)); },
      "elements of BFloat16, got");
  refused([&] { comm.broadcast(at::ones({2}, options), comm.world_size()); }, "not a rank");
  refused([&] { comm.all_reduce(at::Tensor()); }, "undefined");
  // Refused calls issue nothing: the ranks are still in step.
  check_all_reduce(comm, at::kFloat, 10, ReduceOp::kSum);
}

std::string collective_error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const CollectiveError& e) {
    return e.what();
  }
  throw std::runtime_error("expected a CollectiveError, but the collective succeeded");
}

void require_contains(const std::string& text, const std::string& part) {
  require(text.find(part) != std::string::npos, "expected '" + part + "' in: " + text);
}

}  // namespace ddp::testing
