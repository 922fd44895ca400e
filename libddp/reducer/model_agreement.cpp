#include "reducer/model_agreement.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <sstream>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <ddp/errors.h>

namespace ddp::detail {
namespace {

constexpr std::int64_t kReportBytes = 1024;

std::vector<std::string> describe(const std::vector<std::string>& names, const std::vector<at::Tensor>& tensors) {
  std::vector<std::string> lines;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    std::ostringstream line;
    line << names[i] << " " << tensors[i].sizes() << " " << c10::toString(tensors[i].scalar_type());
    lines.push_back(line.str());
  }
  return lines;
}

std::uint64_t fnv1a(const std::string& text) {
  std::uint64_t hash = 1469598103934665603ULL;
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ULL;
  return hash;
}

std::string join(const std::vector<std::string>& lines) {
  std::string text;
  for (const auto& line : lines) text += line + "\n";
  return text;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

/// Every rank's text (at most kReportBytes - 1 bytes each), on the CPU, in rank order.
std::vector<std::string> all_gather_text(Communicator& comm, const std::string& mine) {
  const auto bytes_on_device = at::TensorOptions().device(comm.device()).dtype(at::kByte);
  at::Tensor local = at::zeros({kReportBytes}, at::TensorOptions().dtype(at::kByte));
  std::memcpy(local.data_ptr(), mine.data(), std::min<std::size_t>(mine.size(), kReportBytes - 1));
  at::Tensor input = local.to(comm.device());
  at::Tensor output = at::empty({kReportBytes * comm.world_size()}, bytes_on_device);
  comm.all_gather(output, input)->wait();
  output = output.cpu();
  std::vector<std::string> texts;
  for (int r = 0; r < comm.world_size(); ++r) {
    texts.emplace_back(reinterpret_cast<const char*>(output.data_ptr<uint8_t>() + r * kReportBytes));
  }
  return texts;
}

std::string broadcast_text(Communicator& comm, const std::string& text, int root) {
  const auto options = at::TensorOptions().device(comm.device());
  at::Tensor length = at::full({1}, static_cast<std::int64_t>(text.size()), options.dtype(at::kLong));
  comm.broadcast(length, root)->wait();
  const std::int64_t size = length.cpu().item<std::int64_t>();
  at::Tensor bytes = at::zeros({size}, at::TensorOptions().dtype(at::kByte));
  if (comm.rank() == root) std::memcpy(bytes.data_ptr(), text.data(), text.size());
  bytes = bytes.to(options.device());
  comm.broadcast(bytes, root)->wait();
  bytes = bytes.cpu();
  return std::string(reinterpret_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(size));
}

}  // namespace

void check_same_model_on_all_ranks(Communicator& comm, const std::vector<std::string>& names,
                                   const std::vector<at::Tensor>& tensors) {
  const std::vector<std::string> mine = describe(names, tensors);
  const std::string text = join(mine);
  const auto options = at::TensorOptions().device(comm.device()).dtype(at::kLong);
  at::Tensor summary = at::tensor({static_cast<std::int64_t>(mine.size()), static_cast<std::int64_t>(fnv1a(text))},
                                  at::TensorOptions().dtype(at::kLong))
                           .to(options.device());
  at::Tensor summaries = at::empty({2 * comm.world_size()}, options);
  comm.all_gather(summaries, summary)->wait();
  summaries = summaries.cpu();
  const auto* values = summaries.data_ptr<std::int64_t>();
  bool all_same = true;
  for (int r = 1; r < comm.world_size(); ++r) {
    all_same = all_same && values[2 * r] == values[0] && values[2 * r + 1] == values[1];
  }
  if (all_same) return;

  // Some rank differs from rank 0: find where, on every rank, and tell everyone.
  const std::vector<std::string> reference = split(broadcast_text(comm, text, 0));
  std::string report;
  const std::size_t common = std::min(reference.size(), mine.size());
  for (std::size_t i = 0; i < common && report.empty(); ++i) {
    if (reference[i] != mine[i]) {
      report = fmt::format("#{}: rank 0 has {}, rank {} has {}", i, reference[i], comm.rank(), mine[i]);
    }
  }
  if (report.empty() && reference.size() != mine.size()) {
    report = fmt::format("rank 0 has {} parameters and buffers, rank {} has {}; the first {} agree", reference.size(),
                         comm.rank(), mine.size(), common);
  }
  std::string message = "libddp: the model differs between ranks; every rank must build the same model:";
  const std::vector<std::string> reports = all_gather_text(comm, report);
  for (int r = 1; r < comm.world_size(); ++r) {
    if (!reports[static_cast<std::size_t>(r)].empty()) message += "\n  rank " + std::to_string(r) + ": " + reports[static_cast<std::size_t>(r)];
  }
  throw UsageError(message);
}

void broadcast_coalesced(Communicator& comm, const std::vector<at::Tensor>& tensors, int root) {
  c10::NoGradGuard no_grad;
  std::map<int, std::vector<at::Tensor>> by_dtype;
  for (const auto& tensor : tensors) by_dtype[static_cast<int>(tensor.scalar_type())].push_back(tensor);
  for (auto& [dtype, group] : by_dtype) {
    std::vector<at::Tensor> flat_parts;
    for (const auto& tensor : group) flat_parts.push_back(tensor.reshape({-1}));
    at::Tensor flat = at::cat(flat_parts);
    comm.broadcast(flat, root)->wait_stream();
    std::int64_t offset = 0;
    for (auto& tensor : group) {
      tensor.copy_(flat.narrow(0, offset, tensor.numel()).view(tensor.sizes()));
      offset += tensor.numel();
    }
  }
}

}  // namespace ddp::detail
