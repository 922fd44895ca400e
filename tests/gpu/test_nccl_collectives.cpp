// Every collective over NCCL on 2 GPUs, stream ordering, and the timeout
// path. Needs 2 GPUs: exits with 77 (reported by ctest as skipped) otherwise.

#include <chrono>
#include <cstring>
#include <thread>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "support/collective_checks.h"
#include "support/multiprocess.h"
#include "support/nccl_collective_log.h"

namespace {

using namespace ddp::testing;
using Clock = std::chrono::steady_clock;

std::shared_ptr<ddp::ProcessGroup> init_nccl(std::chrono::milliseconds timeout = std::chrono::seconds(60),
                                             bool copy_engine_reductions = false) {
  return ddp::init(
      ddp::InitOptions().backend(ddp::Backend::kNccl).timeout(timeout).copy_engine_reductions(copy_engine_reductions));
}

TEST(NcclCollectives, AllReduceSumAvgMax) {
  expect_all_succeeded(run_ranks(2, [](int rank) {
    auto pg = init_nccl();
    auto& comm = pg->communicator();
    require(comm.device() == c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(rank)), "wrong device");
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      for (std::int64_t numel : {0, 1, 1000, 1 << 20, 16 << 20}) {
        for (auto op : {ddp::ReduceOp::kSum, ddp::ReduceOp::kAvg, ddp::ReduceOp::kMax}) {
          check_all_reduce(comm, dtype, numel, op);
        }
      }
    }
    check_all_reduce(comm, at::kLong, 1000, ddp::ReduceOp::kSum);
  }));
}

TEST(NcclCollectives, BroadcastAllGatherBarrier) {
  expect_all_succeeded(run_ranks(2, [](int) {
    auto pg = init_nccl();
    auto& comm = pg->communicator();
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      for (std::int64_t numel : {0, 1, 1000, 1 << 20, 16 << 20}) {
        check_broadcast(comm, dtype, numel, 0);
        check_broadcast(comm, dtype, numel, 1);
        check_all_gather(comm, dtype, numel);
        check_reduce_scatter(comm, dtype, numel, ddp::ReduceOp::kAvg);
      }
    }
    check_reduce_scatter(comm, at::kBFloat16, 1 << 20, ddp::ReduceOp::kAvg, at::kFloat);
    check_reduce_scatter(comm, at::kHalf, 1000, ddp::ReduceOp::kSum, at::kFloat);
    check_reduce_scatter(comm, at::kFloat, 1000, ddp::ReduceOp::kSum);
    check_reduce_scatter(comm, at::kLong, 1000, ddp::ReduceOp::kMax);
    check_all_gather_in_place(comm, 1 << 20);
    comm.barrier();
    check_many_in_flight(comm);
    check_usage_errors(comm);
    try {
      comm.all_reduce(at::ones({4}));
      throw std::runtime_error("a CPU tensor was accepted by NCCL");
    } catch (const ddp::UsageError& e) {
      require_contains(e.what(), "is on cpu");
    }
  }));
}

TEST(NcclCollectives, OrderedAfterAndBeforeWorkOnTheCallersStream) {
  expect_all_succeeded(run_ranks(2, [](int rank) {
    auto pg = init_nccl();
    auto& comm = pg->communicator();
    // A side stream as current: the collective must wait for the matmuls
    // queued on it, and the kernel after wait_stream() must see the sum.
    c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromPool(false, pg->device().index()));
    const auto options = at::TensorOptions().device(pg->device());
    for (int trial = 0; trial < 5; ++trial) {
      at::Tensor a = at::eye(4096, options) * (rank + 1);
      for (int i = 0; i < 8; ++i) a = at::matmul(a, at::eye(4096, options));  // slow producer
      comm.all_reduce(a)->wait_stream();
      const at::Tensor doubled = a * 2;  // queued behind the collective, no host wait
      const double expected = 2.0 * 3.0;  // (1 + 2) on the diagonal, times two
      const double diagonal = doubled.diagonal().mean().item<double>();
      require(std::abs(diagonal - expected) < 1e-3, "stream ordering broken: diagonal mean " + std::to_string(diagonal));
    }
  }));
}

TEST(NcclFailures, StalledRankIsNamedWhenTheCollectiveTimesOut) {
  expect_all_succeeded(run_ranks(2, [](int rank) {
    auto pg = init_nccl(std::chrono::seconds(3));
    auto& comm = pg->communicator();
    check_broadcast(comm, at::kFloat, 100, 0);
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(8));  // stuck between collectives
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto start = Clock::now();
    const std::string message = collective_error_of([&] {
      at::Tensor tensor = at::ones({10}, at::TensorOptions().device(pg->device()));
      comm.all_reduce(tensor)->wait();
    });
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    require(seconds >= 2.5 && seconds < 6, "timeout after " + std::to_string(seconds) + " s, expected ~3 s");
    require_contains(message, "all_reduce #2");
    require_contains(message, "timed out after 3000 ms on rank 0 of 2");
    require_contains(message, "rank(s) 1 have not issued #2");
  }));
}

TEST(NcclFailures, WatchdogAbortsATimedOutCollectiveNobodyWaitsFor) {
  expect_all_succeeded(run_ranks(2, [](int rank) {
    auto pg = init_nccl(std::chrono::seconds(2));
    auto& comm = pg->communicator();
    check_broadcast(comm, at::kFloat, 100, 0);
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(7));
      return;
    }
    at::Tensor tensor = at::ones({1 << 20}, at::TensorOptions().device(pg->device()));
    auto work = comm.all_reduce(tensor);
    work->wait_stream();  // the device waits, the host does not
    std::this_thread::sleep_for(std::chrono::seconds(4));
    require(work->is_completed(), "the watchdog did not settle the timed-out collective");
    require_contains(collective_error_of([&] { work->wait(); }), "timed out");
    // The aborted kernel returned: the stream drains instead of hanging.
    (void)tensor.sum().item<float>();
  }));
}

TEST(NcclFailures, FirstCollectiveWithAnAbsentPeerNeverHangs) {
  // NCCL connects lazily, inside the first collective's host call, so with an
  // absent peer either the kernel times out (a CollectiveError) or the host
  // call never returns, and libddp ends the process with exit code 1.
  const auto outcomes = run_ranks(2, [](int rank) {
    auto pg = init_nccl(std::chrono::seconds(3));
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(10));
      return;
    }
    at::Tensor tensor = at::ones({1 << 20}, at::TensorOptions().device(pg->device()));
    const std::string message = collective_error_of([&] { pg->communicator().all_reduce(tensor)->wait(); });
    require_contains(message, "timed out after 3000 ms");
    std::printf("rank 0: the kernel timed out and was aborted\n");
  });
  const RankOutcome& rank0 = outcomes[0];
  EXPECT_FALSE(rank0.hung);
  EXPECT_TRUE(rank0.exit_code == 0 || rank0.exit_code == 1) << rank0.error;
  if (rank0.exit_code == 1) std::printf("rank 0: ended by libddp while blocked inside NCCL\n");
  EXPECT_LT(rank0.seconds, 9.0) << "rank 0 took as long as its sleeping peer: nothing bounded the wait";
}

// Every float dtype and op, one piece and several, a tensor off the 16-byte
// alignment of the vectorised kernel, several in flight, reduce-scatters and
// all-gathers; and NCCL's own log shows that only the small ones reached it.
TEST(CopyEngineReductions, CollectivesMatchAndOnlyTheSmallOnesReachNccl) {
  expect_all_succeeded(run_ranks(
      2,
      [](int rank) {
        auto pg = init_nccl(std::chrono::seconds(60), /*copy_engine_reductions=*/true);
        auto& comm = pg->communicator();
        const int logged_before = nccl_logged_collectives().count;
        int small = 0;
        for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
          // 8,388,609 fp32: a second piece of one element, whose chunk on rank 1 is empty;
          // 17,000,000: two pieces in the 16-bit dtypes too.
          for (std::int64_t numel : {1000, 1 << 18, 1 << 20, 8'388'609, 17'000'000}) {
            for (auto op : {ddp::ReduceOp::kSum, ddp::ReduceOp::kAvg, ddp::ReduceOp::kMax}) {
              check_all_reduce(comm, dtype, numel, op);
              small += numel * static_cast<std::int64_t>(c10::elementSize(dtype)) < (512 << 10);
            }
          }
        }
        // reduce_scatter (out of place and in place) and all_gather: two ranks'
        // input or output of 8 KB (NCCL), 8 MiB (one piece) and 72 MB (several).
        for (auto dtype : {at::kFloat, at::kBFloat16}) {
          for (std::int64_t numel : {1000, 1 << 20, 9'000'007}) {
            check_reduce_scatter(comm, dtype, numel, ddp::ReduceOp::kAvg);
            check_all_gather(comm, dtype, numel);
            small += 2 * numel * static_cast<std::int64_t>(c10::elementSize(dtype)) < (512 << 10) ? 3 : 0;
          }
        }
        // 16-bit gradients reduce-scattered into fp32 shards: the add writes fp32 (the tail of
        // 9,000,007 one element at a time), and the small one widens after NCCL's.
        for (auto dtype : {at::kBFloat16, at::kHalf}) {
          for (std::int64_t numel : {1000, 1 << 20, 9'000'007}) {
            check_reduce_scatter(comm, dtype, numel, ddp::ReduceOp::kAvg, at::kFloat);
            small += 2 * numel * static_cast<std::int64_t>(c10::elementSize(dtype)) < (512 << 10);
          }
        }
        check_all_gather_in_place(comm, 1 << 20);
        check_reduce_scatter(comm, at::kFloat, 1 << 20, ddp::ReduceOp::kSum);
        check_reduce_scatter(comm, at::kFloat, 1 << 20, ddp::ReduceOp::kMax);
        check_all_gather(comm, at::kByte, 600'001);  // bytes only: a length no multiple of 4
        check_all_gather(comm, at::kLong, 100'000);
        const auto options = at::TensorOptions().device(pg->device());
        at::Tensor storage = at::zeros({(1 << 20) + 2}, options);
        at::Tensor misaligned = storage.narrow(0, 1, 1 << 20);  // 4 bytes past the allocation's start
        misaligned.copy_(at::arange(1 << 20, options).remainder(7) + rank);
        comm.all_reduce(misaligned)->wait();
        const double error =
            (misaligned - (2 * at::arange(1 << 20, options).remainder(7) + 1)).abs().max().item<double>();
        require(error == 0, "misaligned all_reduce off by " + std::to_string(error));
        require(storage[0].item<float>() == 0, "the all_reduce wrote before its tensor");
        require(storage[(1 << 20) + 1].item<float>() == 0, "the all_reduce wrote past its tensor");
        std::vector<at::Tensor> tensors;
        std::vector<std::shared_ptr<ddp::Work>> works;
        for (int i = 0; i < 6; ++i) {
          tensors.push_back(at::full({(1 << 19) * (i + 1)}, static_cast<double>(rank + i), options));
          works.push_back(comm.all_reduce(tensors.back()));
        }
        for (int i = 5; i >= 0; --i) works[static_cast<size_t>(i)]->wait();
        for (int i = 0; i < 6; ++i) {
          const double expected = 1 + 2 * i;
          require(tensors[static_cast<size_t>(i)].eq(expected).all().item<bool>(),
                  "in-flight all_reduce " + std::to_string(i) + " is wrong");
        }
        const NcclLoggedCollectives logged_after = nccl_logged_collectives();
        require(logged_after.large == 0,
                std::to_string(logged_after.large) + " collectives of 512 KiB or more reached NCCL");
        const int logged = logged_after.count - logged_before;
        require(logged == small, "NCCL ran " + std::to_string(logged) + " collectives, expected only the " +
                                     std::to_string(small) + " below 512 KiB");
      },
      nccl_logging_collectives()));
}

// Rank 0 queues an NCCL all-reduce its peer never issues and a copy-engine
// one behind it: the timeout must end both and drain the stream. Rank 1,
// waking later, must not take what rank 0's released stream sent it for a
// reduction.
TEST(CopyEngineReductions, AStalledPeerTimesOutTheStreamDrainsAndThePeerLearnsOfIt) {
  expect_all_succeeded(run_ranks(2, [](int rank) {
    auto pg = init_nccl(std::chrono::seconds(2), /*copy_engine_reductions=*/true);
    auto& comm = pg->communicator();
    const auto options = at::TensorOptions().device(pg->device());
    // NCCL connects its peers at their first collective, on the issuing thread: without
    // one here rank 0 would block inside ncclAllReduce, which ends the process instead.
    check_all_reduce(comm, at::kFloat, 1000, ddp::ReduceOp::kSum);
    check_all_reduce(comm, at::kFloat, 1 << 20, ddp::ReduceOp::kSum);
    const auto start = Clock::now();
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(5));  // stuck until rank 0 gave up
      at::Tensor large = at::ones({1 << 20}, options);
      require_contains(collective_error_of([&] { comm.all_reduce(large)->wait(); }),
                       "rank(s) 0 abandoned their copy-engine reductions");
      return;
    }
    at::Tensor small = at::ones({10}, options);
    at::Tensor large = at::ones({1 << 20}, options);
    auto nccl_work = comm.all_reduce(small);
    auto copy_engine_work = comm.all_reduce(large);  // behind it on the communicator's stream
    copy_engine_work->wait_stream();                 // the device waits, the host does not
    const std::string message = collective_error_of([&] { nccl_work->wait(); });
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    require(seconds < 5, "timeout after " + std::to_string(seconds) + " s, expected ~2 s");
    require_contains(message, "all_reduce #3");
    require_contains(message, "timed out after 2000 ms on rank 0 of 2");
    require_contains(collective_error_of([&] { copy_engine_work->wait(); }), "all_reduce #4");
    // NCCL's abort and the raised flags let both end: the stream drains.
    (void)large.sum().item<float>();
    std::this_thread::sleep_until(start + std::chrono::seconds(8));  // rank 1 still maps this rank's staging area
  }));
}

TEST(NcclInit, LocalRankBeyondTheVisibleGpusIsNamed) {
  RunOptions options;
  options.env = {{"RANK", "7"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "7"}, {"LOCAL_WORLD_SIZE", "8"}};
  expect_all_succeeded(run_ranks(1, [](int) {
    try {
      init_nccl();
    } catch (const ddp::UsageError& e) {
      require_contains(e.what(), "LOCAL_RANK=7");
      require_contains(e.what(), "GPU(s) are visible");
      return;
    }
    throw std::runtime_error("init accepted LOCAL_RANK=7");
  }, options));
}

}  // namespace
