#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include <ATen/core/Tensor.h>

#include <ddp/communicator.h>

#include "comm/progress_board.h"

namespace ddp::detail {

using Clock = std::chrono::steady_clock;

/// A collective as a backend launched it.
class BackendOp {
 public:
  virtual ~BackendOp() = default;
  /// True once the collective finished. Throws with the backend's own message
  /// if it failed. Never blocks.
  virtual bool poll() = 0;
  /// Makes the caller's current stream wait for the collective, on the
  /// device. False when the backend has no device streams (the caller then
  /// waits on the host).
  virtual bool order_current_stream() = 0;
};

class CommunicatorBase;

/// One issued collective: its sequence number, description, deadline and fate.
class CollectiveWork final : public Work {
 public:
  enum class Status { kPending, kDone, kFailed };

  CollectiveWork(std::weak_ptr<CommunicatorBase> owner, std::uint64_t sequence, std::string op,
                 std::string detail, Clock::time_point deadline, std::unique_ptr<BackendOp> backend_op);

  void wait() override;
  void wait_stream() override;
  bool is_completed() override;

  /// Polls the backend without blocking and reports a failure to the owner.
  Status refresh(bool from_watchdog = false);
  /// Settles a pending collective as failed; no effect once settled.
  void mark_failed(std::exception_ptr error);
  void rethrow_if_failed();
  /// Current status, without polling the backend.
  Status status();

  std::uint64_t sequence() const { return sequence_; }
  const std::string& op() const { return op_; }
  const std::string& detail() const { return detail_; }
  Clock::time_point deadline() const { return deadline_; }

 private:
  std::weak_ptr<CommunicatorBase> owner_;  // weak: a Work may outlive its communicator
  const std::uint64_t sequence_;
  const std::string op_;
  const std::string detail_;
  const Clock::time_point deadline_;
  std::unique_ptr<BackendOp> backend_op_;

  std::mutex mutex_;
  Status status_ = Status::kPending;
  std::exception_ptr error_;
};

/// What backends share: argument checks, sequence numbers, deadlines, the
/// watchdog that finds timed-out and failed collectives, progress reports,
/// and turning a failure into a CollectiveError that every waiter sees.
///
/// A backend implements the launch_* functions and abort(). Its constructor
/// calls start_watchdog() last and its destructor stop_watchdog() first, so
/// the watchdog only ever sees a fully built backend.
///
/// A launch may block the calling thread inside the backend (NCCL connects
/// to peers lazily, on the first collective that needs a connection). If one
/// is still inside past its deadline, no abort can be issued safely, so the
/// watchdog reports the stuck collective and ends the process: a job whose
/// rank cannot make progress must fail, not hang.
class CommunicatorBase : public Communicator, public std::enable_shared_from_this<CommunicatorBase> {
 public:
  struct Setup {
    int rank = 0;
    int world_size = 1;
    std::chrono::milliseconds timeout{0};
    c10::intrusive_ptr<c10d::Store> store;  ///< For progress reports.
    ProgressBoard::Reconnect reconnect;     ///< For reading them when a collective fails (may be empty).
    std::string name;                       ///< Distinguishes communicators in the store.
    bool check_collectives = false;         ///< InitOptions::check_collectives.
  };

  explicit CommunicatorBase(Setup setup);
  ~CommunicatorBase() override;

  int rank() const final { return rank_; }
  int world_size() const final { return world_size_; }
  std::chrono::milliseconds timeout() const final { return timeout_; }

  std::shared_ptr<Work> all_reduce(const at::Tensor& tensor, ReduceOp op) final;
  std::shared_ptr<Work> broadcast(const at::Tensor& tensor, int root) final;
  std::shared_ptr<Work> all_gather(const at::Tensor& output, const at::Tensor& input) final;
  std::shared_ptr<Work> reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) final;
  void barrier() final;

  /// Watches what the caller's current stream has queued so far as one
  /// collective named `op`, with a deadline and the watchdog's abort: the
  /// replay of a CUDA graph, whose recorded collectives were never launched
  /// one by one and so are watched as a whole (ddp::CapturedStep).
  std::shared_ptr<Work> watch_current_stream(const char* op, std::string detail);

  enum class Failure { kTimeout, kBackendError };
  /// Settles `work` as failed, marks the communicator broken, aborts the
  /// backend and fails every other pending collective. Idempotent.
  void fail(CollectiveWork& work, Failure kind, const std::string& what, bool from_watchdog = false);

 protected:
  virtual std::unique_ptr<BackendOp> launch_all_reduce(const at::Tensor& tensor, ReduceOp op) = 0;
  virtual std::unique_ptr<BackendOp> launch_broadcast(const at::Tensor& tensor, int root) = 0;
  virtual std::unique_ptr<BackendOp> launch_all_gather(const at::Tensor& output, const at::Tensor& input) = 0;
  virtual std::unique_ptr<BackendOp> launch_reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                                                           ReduceOp op) = 0;
  /// Completes when the caller's current stream reaches the point of the
  /// call. Only backends with device streams have one: UsageError otherwise.
  virtual std::unique_ptr<BackendOp> launch_stream_marker();
  /// Makes collectives in flight return (NCCL: ncclCommAbort). Called once,
  /// from whichever thread first sees a failure; never concurrently with a launch.
  virtual void abort() noexcept = 0;
  /// An error the backend reports outside any single collective (NCCL's
  /// asynchronous errors); empty when all is well.
  /// Called with the launch lock held, so never concurrently with a launch or abort().
  virtual std::string poll_async_error() { return {}; }

  void start_watchdog();
  void stop_watchdog() noexcept;

 private:
  using LaunchFn = std::function<std::unique_ptr<BackendOp>()>;
  std::shared_ptr<Work> issue(const char* op, std::string detail, const LaunchFn& launch);
  void check_tensor(const at::Tensor& tensor, const char* op, const char* role) const;
  /// With check_collectives, before each collective: every rank must be about
  /// to issue the same one (operation, dtype, element count, root or reduction),
  /// or every rank throws a CollectiveError naming what each issued. The lock
  /// returned (empty without the check) is held until the collective is issued,
  /// so that another thread's check or collective cannot come between the two.
  std::unique_lock<std::mutex> check_same_on_every_rank(const char* op, c10::ScalarType dtype, std::int64_t numel,
                                                        std::int64_t argument);
  /// Throws UsageError unless `whole` holds world_size() x `part_numel` elements of `dtype`.
  void check_world_multiple(const at::Tensor& whole, std::int64_t part_numel, c10::ScalarType dtype, const char* op,
                            const char* whole_role) const;
  void watchdog_loop();
  void settle_pending();
  /// Ends the process if a launch has been inside the backend past its deadline.
  void end_process_if_launch_stuck();
  /// Takes launch_mutex_, checking meanwhile that the launch holding it is not stuck.
  std::unique_lock<std::mutex> lock_launches();
  std::string describe_failure(std::uint64_t sequence, const std::string& op, const std::string& detail,
                               Failure kind, const std::string& what) const;

  /// The collective whose backend call is running now, if any.
  struct Launch {
    std::uint64_t sequence = 0;
    std::string op;
    std::string detail;
    Clock::time_point deadline;
  };

  const int rank_;
  const int world_size_;
  const std::chrono::milliseconds timeout_;
  const bool check_collectives_;
  ProgressBoard board_;

  std::mutex check_mutex_;   // a check and its collective, issued as one (check_collectives)
  std::mutex launch_mutex_;  // orders launches against abort()
  std::mutex mutex_;         // guards everything below
  std::deque<std::shared_ptr<CollectiveWork>> pending_;
  Progress progress_;
  std::optional<Launch> launching_;
  std::string broken_;  // first failure, once there was one

  std::mutex watchdog_mutex_;
  std::condition_variable watchdog_wakeup_;
  bool watchdog_stop_ = false;
  std::thread watchdog_;
};

}  // namespace ddp::detail
