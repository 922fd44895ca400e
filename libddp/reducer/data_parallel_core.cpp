#include <ddp/distributed_data_parallel.h>

#include <cmath>
#include <cstdlib>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <ddp/errors.h>

#include "reducer/buffer_sync.h"
#include "reducer/model_agreement.h"
#include "reducer/reducer.h"
#include "reducer/timeline.h"

namespace ddp::detail {
namespace {

std::size_t mebibytes_to_bytes(double mebibytes, const char* option) {
  if (!(mebibytes > 0) || !std::isfinite(mebibytes)) {
    throw UsageError(fmt::format("DistributedDataParallelOptions::{} must be a positive number of MiB, got {}",
                                 option, mebibytes));
  }
  return static_cast<std::size_t>(std::max(1.0, mebibytes * (1 << 20)));
}

}  // namespace

DataParallelCore::DataParallelCore(std::shared_ptr<torch::nn::Module> module,
                                   std::shared_ptr<ProcessGroup> process_group,
                                   const DistributedDataParallelOptions& options)
    : module_(std::move(module)), process_group_(std::move(process_group)), options_(options) {
  if (!module_) throw UsageError("libddp: DistributedDataParallel was given no module");
  if (!process_group_) throw UsageError("libddp: DistributedDataParallel was given no process group");
  Communicator& comm = process_group_->communicator();

  std::vector<at::Tensor> trained;
  std::vector<std::string> names;
  std::vector<at::Tensor> state;  // every parameter and buffer, copied from rank 0
  for (const auto& item : module_->named_parameters()) {
    state.push_back(item.value());
    if (!item.value().requires_grad()) continue;
    trained.push_back(item.value());
    names.push_back(item.key());
  }
  if (trained.empty()) throw UsageError("libddp: the module has no parameter that requires a gradient");
  check_same_parameters_on_all_ranks(comm, names, trained);
  std::vector<at::Tensor> buffers = module_->buffers();
  state.insert(state.end(), buffers.begin(), buffers.end());
  broadcast_coalesced(comm, state, 0);
  if (options.broadcast_buffers() && !buffers.empty() && process_group_->world_size() > 1) {
    buffer_sync_ = std::make_unique<BufferSync>(std::move(buffers));
  }

  Reducer::Config config;
  config.first_bucket_bytes = mebibytes_to_bytes(options.first_bucket_cap_mb(), "first_bucket_cap_mb");
  config.bucket_bytes = mebibytes_to_bytes(options.bucket_cap_mb(), "bucket_cap_mb");
  config.gradient_as_bucket_view = options.gradient_as_bucket_view();
  config.find_unused_parameters = options.find_unused_parameters();
  config.static_graph = options.static_graph();
  config.comm_hook = options.comm_hook() ? options.comm_hook() : comm_hooks::average();
  config.reduce = options.comm_hook() != nullptr || process_group_->world_size() > 1;
  std::string timeline_path = options.timeline_path();
  const char* prefix = std::getenv("DDP_TIMELINE");
  if (timeline_path.empty() && prefix != nullptr && *prefix != '\0') {
    timeline_path = fmt::format("{}.rank{}.json", prefix, process_group_->rank());
  }
  if (options.record_timeline() || !timeline_path.empty()) {
    timeline_ = std::make_shared<Timeline>(comm.device(), process_group_->rank(), timeline_path);
    config.timeline = timeline_;
  }
  reducer_ = std::make_shared<Reducer>(std::move(trained), std::move(names), comm, std::move(config));
  reducer_->install_hooks();
}

DataParallelCore::~DataParallelCore() = default;

void DataParallelCore::before_forward() {
  reducer_->prepare_for_forward();
  if (buffer_sync_ && module_->is_training()) {
    buffer_sync_->broadcast(process_group_->communicator(), 0);
  }
}

void DataParallelCore::after_forward(const std::vector<at::Tensor>& outputs) {
  if (at::GradMode::is_enabled()) reducer_->prepare_for_backward(outputs);
}

void DataParallelCore::set_sync(bool sync) { reducer_->set_sync(sync); }
bool DataParallelCore::sync() const { return reducer_->sync(); }
std::vector<std::size_t> DataParallelCore::bucket_bytes() const { return reducer_->bucket_bytes(); }
std::vector<IterationTiming> DataParallelCore::timings() const {
  return timeline_ ? timeline_->timings() : std::vector<IterationTiming>{};
}

}  // namespace ddp::detail
