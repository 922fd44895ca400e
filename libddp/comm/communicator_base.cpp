#include "comm/communicator_base.h"

#include <algorithm>
#include <iostream>
#include <vector>

#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>

#include <ddp/errors.h>

#include "cuda/stream_capture.h"

namespace ddp::detail {
namespace {

// How often the watchdog looks at the collectives in flight. Bounds how late a
// timeout is noticed when no thread waits, and how stale published progress is.
constexpr std::chrono::milliseconds kWatchdogInterval{100};

/// Stands for a collective with nothing to move (zero elements): done at once.
class CompletedOp final : public BackendOp {
 public:
  bool poll() override { return true; }
  bool order_current_stream() override { return true; }
};

std::string describe_tensor(const at::Tensor& tensor) {
  return fmt::format("{} x {} on {}", tensor.numel(), c10::toString(tensor.scalar_type()), tensor.device().str());
}

// The collectives check_same_on_every_rank tells apart, by their index here.
constexpr const char* kCheckedOps[] = {"all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"};
constexpr int kFingerprintFields = 5;  // sequence, operation, dtype, element count, root or reduction

/// What a rank's fingerprint says it was about to issue.
std::string describe_fingerprint(const std::int64_t* fingerprint) {
  const std::int64_t op = fingerprint[1];
  const std::string name = op >= 0 && op < static_cast<std::int64_t>(std::size(kCheckedOps)) ? kCheckedOps[op] : "?";
  const auto dtype = static_cast<c10::ScalarType>(fingerprint[2]);
  std::string argument;
  if (name == "all_reduce" || name == "reduce_scatter") {
    argument = to_string(static_cast<ReduceOp>(fingerprint[4])) + ", ";
  } else if (name == "broadcast") {
    argument = fmt::format("root {}, ", fingerprint[4]);
  }
  return fmt::format("{} #{} ({}{} x {})", name, fingerprint[0], argument, fingerprint[3], c10::toString(dtype));
}

CollectiveError make_error(const CollectiveWork& work, std::string message, int rank) {
  return CollectiveError(std::move(message), work.op(), work.sequence(), rank);
}

}  // namespace

// ---------------------------------------------------------------- CollectiveWork

CollectiveWork::CollectiveWork(std::weak_ptr<CommunicatorBase> owner, std::uint64_t sequence, std::string op,
                               std::string detail, Clock::time_point deadline,
                               std::unique_ptr<BackendOp> backend_op)
    : owner_(std::move(owner)),
      sequence_(sequence),
      op_(std::move(op)),
      detail_(std::move(detail)),
      deadline_(deadline),
      backend_op_(std::move(backend_op)) {}

CollectiveWork::Status CollectiveWork::refresh(bool from_watchdog) {
  std::string failure;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (status_ != Status::kPending) return status_;
    try {
      if (backend_op_->poll()) status_ = Status::kDone;
      return status_;
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  if (auto owner = owner_.lock()) {
    // A backend with a timeout of its own (Gloo gets libddp's) starts it
    // after the deadline was set, so a failure at or past the deadline is
    // that timeout: report it as one, naming the ranks that are behind.
    const auto kind =
        Clock::now() >= deadline_ ? CommunicatorBase::Failure::kTimeout : CommunicatorBase::Failure::kBackendError;
    owner->fail(*this, kind, failure, from_watchdog);
  } else {
    mark_failed(std::make_exception_ptr(CollectiveError(
        fmt::format("libddp: {} #{} ({}) failed: {}", op_, sequence_, detail_, failure), op_, sequence_, -1)));
  }
  return Status::kFailed;
}

void CollectiveWork::mark_failed(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (status_ != Status::kPending) return;
  status_ = Status::kFailed;
  error_ = std::move(error);
}

void CollectiveWork::rethrow_if_failed() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (status_ == Status::kFailed) std::rethrow_exception(error_);
}

void CollectiveWork::wait() {
  // Poll with a growing pause: a collective that is about to finish costs
  // microseconds, one that takes long costs no CPU.
  std::chrono::microseconds pause{1};
  for (;;) {
    const Status status = refresh();
    if (status == Status::kDone) return;
    if (status == Status::kFailed) rethrow_if_failed();
    if (Clock::now() >= deadline_) {
      if (auto owner = owner_.lock()) {
        owner->fail(*this, CommunicatorBase::Failure::kTimeout, "");
      } else {
        mark_failed(std::make_exception_ptr(CollectiveError(
            fmt::format("libddp: {} #{} ({}) timed out after its communicator was destroyed", op_, sequence_,
                        detail_),
            op_, sequence_, -1)));
      }
      rethrow_if_failed();
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

void CollectiveWork::wait_stream() {
  rethrow_if_failed();
  if (!backend_op_->order_current_stream()) wait();
}

bool CollectiveWork::is_completed() { return refresh() != Status::kPending; }

CollectiveWork::Status CollectiveWork::status() {
  std::lock_guard<std::mutex> lock(mutex_);
  return status_;
}

// ---------------------------------------------------------------- CommunicatorBase

CommunicatorBase::CommunicatorBase(Setup setup)
    : rank_(setup.rank),
      world_size_(setup.world_size),
      timeout_(setup.timeout),
      check_collectives_(setup.check_collectives),
      board_(setup.store, "ddp/progress/" + setup.name + "/", setup.rank, setup.world_size,
             std::move(setup.reconnect)) {}

CommunicatorBase::~CommunicatorBase() { stop_watchdog(); }

void CommunicatorBase::check_tensor(const at::Tensor& tensor, const char* op, const char* role) const {
  if (!tensor.defined()) {
    throw UsageError(fmt::format("libddp: {}: the {} tensor is undefined", op, role));
  }
  if (tensor.device() != device()) {
    throw UsageError(fmt::format("libddp: {}: the {} tensor is on {}, but this {} communicator works on {}; move "
                                 "it with .to(process_group->device())",
                                 op, role, tensor.device().str(), to_string(backend()), device().str()));
  }
  if (!tensor.is_contiguous()) {
    throw UsageError(
        fmt::format("libddp: {}: the {} tensor is not contiguous; pass tensor.contiguous()", op, role));
  }
}

std::unique_lock<std::mutex> CommunicatorBase::check_same_on_every_rank(const char* op, c10::ScalarType dtype,
                                                                        std::int64_t numel, std::int64_t argument) {
  // A recorded step cannot wait on the host; its collectives were checked
  // when its eager warm-up steps ran them. (Only a CUDA communicator asks:
  // on Gloo the question would need a CUDA context, or fail without a GPU.)
  if (!check_collectives_ || world_size_ == 1 || (device().is_cuda() && current_stream_capturing())) return {};
  std::unique_lock<std::mutex> checked(check_mutex_);
  const auto op_index = std::find_if(std::begin(kCheckedOps), std::end(kCheckedOps),
                                     [op](const char* name) { return std::string(name) == op; }) -
                        std::begin(kCheckedOps);
  std::int64_t sequence = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    sequence = progress_.issued + 2;  // the check below is issued first
  }
  const std::int64_t fingerprint[kFingerprintFields] = {sequence, op_index, static_cast<std::int64_t>(dtype), numel,
                                                        argument};
  const at::Tensor mine = at::tensor(c10::ArrayRef<std::int64_t>(fingerprint), at::kLong).to(device());
  const at::Tensor all = at::empty({world_size_ * kFingerprintFields}, mine.options());
  issue("collective check", describe_fingerprint(fingerprint), [&]() { return launch_all_gather(all, mine); })->wait();
  const at::Tensor fingerprints = all.cpu();
  const std::int64_t* values = fingerprints.data_ptr<std::int64_t>();
  bool same = true;
  for (int rank = 1; rank < world_size_; ++rank) {
    same = same && std::equal(values, values + kFingerprintFields, values + rank * kFingerprintFields);
  }
  if (same) return checked;
  std::string issued;
  for (int rank = 0; rank < world_size_; ++rank) {
    issued += fmt::format("\n  rank {}: {}", rank, describe_fingerprint(values + rank * kFingerprintFields));
  }
  throw CollectiveError(
      fmt::format("libddp: the ranks were about to issue different collectives (DDP_CHECK_COLLECTIVES):{}\nEvery "
                  "rank must issue the same collectives in the same order, with the same sizes; the first rank "
                  "that differs names the code path to look at.",
                  issued),
      op, static_cast<std::uint64_t>(sequence), rank_);
}

std::shared_ptr<Work> CommunicatorBase::all_reduce(const at::Tensor& tensor, ReduceOp op) {
  check_tensor(tensor, "all_reduce", "input");
  if (op == ReduceOp::kAvg && !at::isFloatingType(tensor.scalar_type())) {
    throw UsageError(fmt::format("libddp: all_reduce: avg needs a floating-point tensor, got {}; use sum and "
                                 "divide, or convert the tensor",
                                 c10::toString(tensor.scalar_type())));
  }
  const auto checked =
      check_same_on_every_rank("all_reduce", tensor.scalar_type(), tensor.numel(), static_cast<std::int64_t>(op));
  // On one rank the result is the tensor itself. NCCL would still run a
  // kernel over it (an average scales every element by 1): 5 ms of a
  // LLaMA-1.1B step's gradients on an H200.
  return issue("all_reduce", fmt::format("{}, {}", to_string(op), describe_tensor(tensor)),
               [&]() {
                 return tensor.numel() == 0 || world_size_ == 1 ? nullptr : launch_all_reduce(tensor, op);
               });
}

std::shared_ptr<Work> CommunicatorBase::watch_current_stream(const char* op, std::string detail) {
  return issue(op, std::move(detail), [&]() { return launch_stream_marker(); });
}

std::unique_ptr<BackendOp> CommunicatorBase::launch_stream_marker() {
  throw UsageError(fmt::format("libddp: the {} backend has no device streams to watch; a captured step needs NCCL",
                               to_string(backend())));
}

std::shared_ptr<Work> CommunicatorBase::broadcast(const at::Tensor& tensor, int root) {
  check_tensor(tensor, "broadcast", "input");
  if (root < 0 || root >= world_size_) {
    throw UsageError(fmt::format("libddp: broadcast: root {} is not a rank of this job (0..{})", root,
                                 world_size_ - 1));
  }
  const auto checked = check_same_on_every_rank("broadcast", tensor.scalar_type(), tensor.numel(), root);
  return issue("broadcast", fmt::format("root {}, {}", root, describe_tensor(tensor)),
               [&]() {
                 return tensor.numel() == 0 || world_size_ == 1 ? nullptr : launch_broadcast(tensor, root);
               });
}

void CommunicatorBase::check_world_multiple(const at::Tensor& whole, std::int64_t part_numel, c10::ScalarType dtype,
                                            const char* op, const char* whole_role) const {
  if (whole.scalar_type() != dtype || whole.numel() != part_numel * world_size_) {
    throw UsageError(
        fmt::format("libddp: {}: the {} must hold world_size ({}) x {} elements of {}, got {} "
                    "elements of {}",
                    op, whole_role, world_size_, part_numel, c10::toString(dtype), whole.numel(),
                    c10::toString(whole.scalar_type())));
  }
}

std::shared_ptr<Work> CommunicatorBase::all_gather(const at::Tensor& output, const at::Tensor& input) {
  check_tensor(input, "all_gather", "input");
  check_tensor(output, "all_gather", "output");
  check_world_multiple(output, input.numel(), input.scalar_type(), "all_gather", "output");
  const auto checked = check_same_on_every_rank("all_gather", input.scalar_type(), input.numel(), 0);
  return issue("all_gather", describe_tensor(input),
               [&]() {
                 return input.numel() == 0 ? nullptr : launch_all_gather(output, input);
               });
}

std::shared_ptr<Work> CommunicatorBase::reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                                                       ReduceOp op) {
  check_tensor(input, "reduce_scatter", "input");
  check_tensor(output, "reduce_scatter", "output");
  // A 16-bit input may be reduced into an fp32 output (the sum is taken in
  // fp32 where libddp reduces itself; NCCL's is cast afterwards).
  const bool widens =
      output.scalar_type() == at::kFloat && (input.scalar_type() == at::kBFloat16 || input.scalar_type() == at::kHalf);
  check_world_multiple(input, output.numel(), widens ? input.scalar_type() : output.scalar_type(), "reduce_scatter",
                       "input");
  if (op == ReduceOp::kAvg && !at::isFloatingType(input.scalar_type())) {
    throw UsageError(fmt::format("libddp: reduce_scatter: avg needs a floating-point tensor, got {}; use sum and "
                                 "divide, or convert the tensor",
                                 c10::toString(input.scalar_type())));
  }
  const auto checked =
      check_same_on_every_rank("reduce_scatter", input.scalar_type(), input.numel(), static_cast<std::int64_t>(op));
  return issue("reduce_scatter", fmt::format("{}, {}", to_string(op), describe_tensor(input)),
               [&]() -> std::unique_ptr<BackendOp> {
                 if (output.numel() == 0) return nullptr;
                 if (world_size_ > 1) return launch_reduce_scatter(output, input, op);
                 // One rank: the result is the input, already in place or one copy away.
                 if (output.data_ptr() != input.data_ptr()) output.view({-1}).copy_(input.view({-1}));
                 return nullptr;
               });
}

void CommunicatorBase::barrier() {
  auto token = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device()));
  const auto checked = check_same_on_every_rank("barrier", token.scalar_type(), token.numel(), 0);
  issue("barrier", "1 element", [&]() {
    return launch_all_reduce(token, ReduceOp::kSum);
  })->wait();
}

std::shared_ptr<Work> CommunicatorBase::issue(const char* op, std::string detail, const LaunchFn& launch) {
  std::uint64_t sequence = 0;
  const Clock::time_point deadline = Clock::now() + timeout_;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!broken_.empty()) {
      throw CollectiveError(fmt::format("libddp: {} called on rank {} after this communicator failed; it is "
                                        "unusable. The first failure was:\n{}",
                                        op, rank_, broken_),
                            op, progress_.issued + 1, rank_);
    }
    sequence = ++progress_.issued;
    progress_.issued_op = op;
  }

  std::unique_ptr<BackendOp> backend_op;
  std::string launch_failure;
  {
    auto lock = lock_launches();
    // launching_ names the collective inside the backend call for the
    // watchdog, and is cleared however the call ends.
    struct LaunchRecord {
      CommunicatorBase& self;
      LaunchRecord(CommunicatorBase& owner, Launch launch) : self(owner) {
        std::lock_guard<std::mutex> state_lock(self.mutex_);
        self.launching_ = std::move(launch);
      }
      ~LaunchRecord() {
        std::lock_guard<std::mutex> state_lock(self.mutex_);
        self.launching_.reset();
      }
    } record(*this, Launch{sequence, op, detail, deadline});
    try {
      backend_op = launch();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      launch_failure = e.what();
    }
  }
  auto work = std::make_shared<CollectiveWork>(weak_from_this(), sequence, op, std::move(detail), deadline,
                                               backend_op ? std::move(backend_op) : std::make_unique<CompletedOp>());
  if (!launch_failure.empty()) {
    fail(*work, Failure::kBackendError, launch_failure);
    work->rethrow_if_failed();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.push_back(work);
  }
  return work;
}

std::unique_lock<std::mutex> CommunicatorBase::lock_launches() {
  std::unique_lock<std::mutex> lock(launch_mutex_, std::defer_lock);
  while (!lock.try_lock()) {
    end_process_if_launch_stuck();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return lock;
}

void CommunicatorBase::end_process_if_launch_stuck() {
  std::optional<Launch> launch;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    launch = launching_;
  }
  if (!launch || Clock::now() < launch->deadline) return;
  std::cerr << describe_failure(launch->sequence, launch->op, launch->detail, Failure::kTimeout, "")
            << "\nThe thread that issued it is still blocked inside the communication library, so the collective "
               "cannot be cancelled: libddp ends this process (exit code 1) rather than let the job hang."
            << std::endl;
  std::_Exit(1);
}

std::string CommunicatorBase::describe_failure(std::uint64_t sequence, const std::string& op,
                                               const std::string& detail, Failure kind,
                                               const std::string& what) const {
  const std::string headline =
      kind == Failure::kTimeout
          ? fmt::format("libddp: {} #{} ({}) timed out after {} ms on rank {} of {}{}.", op, sequence, detail,
                        timeout_.count(), rank_, world_size_,
                        what.empty() ? "" : fmt::format(" (the backend reported: {})", what.substr(0, what.find('\n'))))
          : fmt::format("libddp: {} #{} ({}) failed on rank {} of {}: {}", op, sequence, detail, rank_, world_size_,
                        what);
  return fmt::format(
      "{}\nProgress of the other ranks:{}\nEvery rank must issue the same collectives in the same order. Look at "
      "the output of the ranks named above; if the work between two collectives legitimately takes longer than "
      "the timeout, raise it with DDP_TIMEOUT=SECONDS (ddprun --timeout) or ddp::InitOptions().timeout(...).",
      headline, board_.describe_peers(sequence, op, kind == Failure::kTimeout));
}

void CommunicatorBase::fail(CollectiveWork& work, Failure kind, const std::string& what, bool from_watchdog) {
  bool first = false;
  std::string message;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    first = broken_.empty();
  }
  if (first) message = describe_failure(work.sequence(), work.op(), work.detail(), kind, what);

  std::deque<std::shared_ptr<CollectiveWork>> others;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!broken_.empty()) {
      first = false;
      message = fmt::format("libddp: {} #{} ({}) on rank {} was abandoned because the communicator failed "
                            "earlier:\n{}",
                            work.op(), work.sequence(), work.detail(), rank_, broken_);
    } else {
      broken_ = message;
      others.swap(pending_);
    }
  }
  work.mark_failed(std::make_exception_ptr(make_error(work, message, rank_)));
  if (!first) return;

  if (from_watchdog) std::cerr << message << std::endl;
  {
    auto lock = lock_launches();
    abort();
  }
  for (auto& other : others) {
    if (other.get() == &work) continue;
    other->mark_failed(std::make_exception_ptr(make_error(
        *other,
        fmt::format("libddp: {} #{} ({}) on rank {} was abandoned because {} #{} failed:\n{}", other->op(),
                    other->sequence(), other->detail(), rank_, work.op(), work.sequence(), message),
        rank_)));
  }
}

void CommunicatorBase::start_watchdog() { watchdog_ = std::thread([this] { watchdog_loop(); }); }

void CommunicatorBase::stop_watchdog() noexcept {
  {
    std::lock_guard<std::mutex> lock(watchdog_mutex_);
    watchdog_stop_ = true;
  }
  watchdog_wakeup_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

void CommunicatorBase::watchdog_loop() {
  Progress published;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(watchdog_mutex_);
      if (watchdog_wakeup_.wait_for(lock, kWatchdogInterval, [this] { return watchdog_stop_; })) return;
    }
    settle_pending();
    Progress now;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      now = progress_;
    }
    if (!(now == published)) {
      board_.publish(now);
      published = now;
    }
  }
}

void CommunicatorBase::settle_pending() {
  end_process_if_launch_stuck();
  std::vector<std::shared_ptr<CollectiveWork>> snapshot;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    snapshot.assign(pending_.begin(), pending_.end());
  }
  std::string async_error;
  if (!snapshot.empty()) {
    auto lock = lock_launches();
    async_error = poll_async_error();
  }
  for (auto& work : snapshot) {
    CollectiveWork::Status status = work->refresh(/*from_watchdog=*/true);
    if (status == CollectiveWork::Status::kPending) {
      if (!async_error.empty()) {
        fail(*work, Failure::kBackendError, async_error, /*from_watchdog=*/true);
      } else if (Clock::now() >= work->deadline()) {
        fail(*work, Failure::kTimeout, "", /*from_watchdog=*/true);
      }
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  // Collectives of one communicator finish in issue order, so the settled
  // prefix of the queue is what has completed.
  while (!pending_.empty() && pending_.front()->status() != CollectiveWork::Status::kPending) {
    if (pending_.front()->status() == CollectiveWork::Status::kDone) {
      progress_.completed = pending_.front()->sequence();
      progress_.completed_op = pending_.front()->op();
    }
    pending_.pop_front();
  }
}

}  // namespace ddp::detail
