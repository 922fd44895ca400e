// Every collective over Gloo, in real processes of 2 and 3 ranks, and what
// the survivors see when a rank dies or stalls.

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "support/collective_checks.h"
#include "support/multiprocess.h"

namespace {

using namespace ddp::testing;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

std::shared_ptr<ddp::ProcessGroup> init_gloo(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  return ddp::init(ddp::InitOptions().backend(ddp::Backend::kGloo).timeout(timeout));
}

/// Returns once something listens on loopback at `port` (within 60 s).
void wait_until_listening(std::uint16_t port) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  for (;;) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(port);
    const bool listening = ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
    ::close(fd);
    if (listening) return;
    require(Clock::now() < deadline, "nothing listens on port " + std::to_string(port));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

class GlooCollectives : public ::testing::TestWithParam<int> {};

TEST_P(GlooCollectives, AllReduceEveryDtypeSizeAndOp) {
  expect_all_succeeded(run_ranks(GetParam(), [](int) {
    auto pg = init_gloo();
    auto& comm = pg->communicator();
    require(comm.backend() == ddp::Backend::kGloo && comm.device().is_cpu(), "expected a Gloo CPU communicator");
    for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kLong}) {
      for (std::int64_t numel : {0, 1, 1000, 1 << 20}) {
        check_all_reduce(comm, dtype, numel, ddp::ReduceOp::kSum);
        check_all_reduce(comm, dtype, numel, ddp::ReduceOp::kMax);
        if (at::isFloatingType(dtype)) check_all_reduce(comm, dtype, numel, ddp::ReduceOp::kAvg);
      }
    }
    check_all_reduce(comm, at::kFloat, 10'000'000, ddp::ReduceOp::kSum);  // 40 MB
  }));
}

TEST_P(GlooCollectives, BroadcastFromEveryRoot) {
  expect_all_succeeded(run_ranks(GetParam(), [](int) {
    auto pg = init_gloo();
    for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kLong}) {
      for (std::int64_t numel : {0, 1, 1000, 1 << 20}) {
        for (int root = 0; root < pg->world_size(); ++root) check_broadcast(pg->communicator(), dtype, numel, root);
      }
    }
    check_broadcast(pg->communicator(), at::kFloat, 10'000'000, pg->world_size() - 1);
  }));
}

TEST_P(GlooCollectives, AllGather) {
  expect_all_succeeded(run_ranks(GetParam(), [](int) {
    auto pg = init_gloo();
    for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kLong}) {
      for (std::int64_t numel : {0, 1, 1000, 1 << 20}) check_all_gather(pg->communicator(), dtype, numel);
    }
    check_all_gather(pg->communicator(), at::kFloat, 4'000'000);
  }));
}

TEST_P(GlooCollectives, ReduceScatter) {
  expect_all_succeeded(run_ranks(GetParam(), [](int) {
    auto pg = init_gloo();
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      for (std::int64_t numel : {0, 1, 1000}) {
        for (auto op : {ddp::ReduceOp::kSum, ddp::ReduceOp::kAvg}) check_reduce_scatter(pg->communicator(), dtype, numel, op);
      }
    }
    check_reduce_scatter(pg->communicator(), at::kLong, 1000, ddp::ReduceOp::kMax);
    check_reduce_scatter(pg->communicator(), at::kFloat, 1 << 20, ddp::ReduceOp::kAvg);
    check_reduce_scatter(pg->communicator(), at::kBFloat16, 1000, ddp::ReduceOp::kAvg, at::kFloat);
    check_all_gather_in_place(pg->communicator(), 1000);
  }));
}

TEST_P(GlooCollectives, BarrierManyInFlightAndUsageErrors) {
  expect_all_succeeded(run_ranks(GetParam(), [](int rank) {
    auto pg = init_gloo();
    // A rank that arrives late holds the others at the barrier: none leaves
    // it before rank 0 entered it (steady_clock is one clock for every
    // process of a host, so the ranks' own start-up lags do not count).
    if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    at::Tensor rank0_entered = at::full({1}, Clock::now().time_since_epoch().count(), at::kLong);
    pg->communicator().barrier();
    const auto left = Clock::now().time_since_epoch().count();
    pg->communicator().broadcast(rank0_entered, 0)->wait();
    if (rank != 0) require(left >= rank0_entered.item<std::int64_t>(), "barrier did not wait for rank 0");
    check_many_in_flight(pg->communicator());
    check_usage_errors(pg->communicator());
  }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooCollectives, ::testing::Values(2, 3),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

TEST(GlooFailures, DeadRankMakesSurvivorsFailWithinTheTimeout) {
  const auto outcomes = run_ranks(3, [](int rank) {
    auto pg = init_gloo(std::chrono::seconds(20));
    auto& comm = pg->communicator();
    check_all_reduce(comm, at::kFloat, 1000, ddp::ReduceOp::kSum);
    std::this_thread::sleep_for(std::chrono::seconds(1));  // lets the watchdogs (every 0.1 s) publish progress
    if (rank == 1) std::_Exit(3);  // dies without a word, as a crashed process does
    const auto start = Clock::now();
    const std::string message = collective_error_of([&] {
      at::Tensor tensor = at::ones({1000});
      comm.all_reduce(tensor)->wait();
    });
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    // Rank 0 serves the store both survivors read the others' progress from:
    // it stays until rank 2 has made its report (a store gone by then makes
    // the report name rank 0 as the suspect, another outcome than tested here).
    const fs::path reported = fs::path(std::getenv("DDP_TEST_RESULT_DIR")) / "rank2-reported";
    if (rank == 2) std::ofstream(reported) << "done";
    for (auto waited = Clock::now(); rank == 0 && !fs::exists(reported) && Clock::now() - waited < 30s;) {
      std::this_thread::sleep_for(10ms);
    }
    require(seconds < 25, "the error took " + std::to_string(seconds) + " s, more than the 20 s timeout");
    require_contains(message, "all_reduce #2");
    require_contains(message, "rank " + std::to_string(rank) + " of 3");
    require_contains(message, "rank 1: issued #1");
    // The communicator is unusable afterwards, and says why.
    require_contains(collective_error_of([&] { comm.barrier(); }), "after this communicator failed");
  });
  EXPECT_EQ(outcomes[1].exit_code, 3);
  for (int rank : {0, 2}) {
    EXPECT_EQ(outcomes[static_cast<size_t>(rank)].exit_code, 0)
        << "rank " << rank << ": " << outcomes[static_cast<size_t>(rank)].error;
  }
}

// Rank 0 waits on its all-reduce at once, or only after Gloo's own timeout
// (libddp's, started a moment later) has failed it too: either way the
// report is libddp's timeout, naming the rank that is behind.
class GlooStalledRank : public ::testing::TestWithParam<bool> {};

TEST_P(GlooStalledRank, IsNamedWhenTheCollectiveTimesOut) {
  const bool wait_after_the_backend_timed_out = GetParam();
  const auto outcomes = run_ranks(2, [wait_after_the_backend_timed_out](int rank) {
    auto pg = init_gloo(std::chrono::seconds(2));
    auto& comm = pg->communicator();
    check_broadcast(comm, at::kFloat, 100, 0);
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(5));  // stuck between collectives
      return;
    }
    const auto start = Clock::now();
    const std::string message = collective_error_of([&] {
      at::Tensor tensor = at::ones({10});
      auto work = comm.all_reduce(tensor);
      if (wait_after_the_backend_timed_out) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      work->wait();
    });
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const double expected = wait_after_the_backend_timed_out ? 2.5 : 2.0;
    require(seconds >= 1.5 && seconds < expected + 2.5,
            "timeout after " + std::to_string(seconds) + " s, expected ~" + std::to_string(expected) + " s");
    require_contains(message, "all_reduce #2 (sum, 10 x Float on cpu) timed out after 2000 ms on rank 0 of 2");
    require_contains(message, "rank 1: issued #1 (broadcast), completed #1 (broadcast)");
    require_contains(message, "rank(s) 1 have not issued #2");
  });
  expect_all_succeeded(outcomes);
}

INSTANTIATE_TEST_SUITE_P(GlooFailures, GlooStalledRank, ::testing::Bool(), [](const auto& info) {
  return info.param ? "WaitingAfterTheBackendTimedOut" : "WaitingAtOnce";
});

// Rank 1's all-reduce once rank 0 cannot answer (DDP_TIMEOUT=2): the report
// must come within the timeout plus the store's few seconds.
std::string report_of_an_all_reduce_without_rank_zero(ddp::Communicator& comm) {
  const auto start = Clock::now();
  const std::string message = collective_error_of([&] {
    at::Tensor tensor = at::ones({10});
    comm.all_reduce(tensor)->wait();
  });
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  require(seconds < 2 + 5 + 3, "rank 1 reported after " + std::to_string(seconds) + " s");
  return message;
}

// A stopped rank 0 (kill -STOP) stops the rendezvous store it serves too: the
// rank whose collective times out must still report within the timeout plus
// a few seconds, naming rank 0, instead of waiting on the store. The timeout
// comes from DDP_TIMEOUT, as ddprun --timeout passes it.
TEST(GlooFailures, AStoppedRankZeroIsNamedInBoundedTime) {
  RunOptions options;
  options.env = {{"DDP_TIMEOUT", "2"}};
  const auto outcomes = run_ranks(
      2,
      [](int rank) {
        auto pg = ddp::init(ddp::InitOptions().backend(ddp::Backend::kGloo));
        auto& comm = pg->communicator();
        at::Tensor rank0_pid = at::full({1}, static_cast<std::int64_t>(::getpid()), at::kLong);
        comm.broadcast(rank0_pid, 0)->wait();
        if (rank == 0) {
          ::raise(SIGSTOP);
          return;
        }
        // Rank 1 ends the stopped rank 0 once it has checked its report, whatever the outcome.
        struct KillRank0 {
          pid_t pid;
          ~KillRank0() { ::kill(pid, SIGKILL); }
        } kill_rank0{static_cast<pid_t>(rank0_pid.item<std::int64_t>())};
        const std::string message = report_of_an_all_reduce_without_rank_zero(comm);
        require_contains(message, "timed out after 2000 ms");
        require_contains(message, "rank 0 is stopped or hung, and is the suspect");
      },
      options);
  ASSERT_EQ(outcomes.size(), 2u);
  EXPECT_EQ(outcomes[1].exit_code, 0) << outcomes[1].error;
  EXPECT_EQ(outcomes[0].signal, SIGKILL) << "rank 0 was not stopped until rank 1 ended it";
}

// A rank 0 that has exited (it failed, or it left after reporting another
// rank's failure) took the store with it: the survivor's report says so
// instead of calling rank 0 stopped or hung.
TEST(GlooFailures, ARankZeroThatExitedIsReportedAsExited) {
  RunOptions options;
  options.env = {{"DDP_TIMEOUT", "2"}};
  const auto outcomes = run_ranks(
      2,
      [](int rank) {
        auto pg = ddp::init(ddp::InitOptions().backend(ddp::Backend::kGloo));
        auto& comm = pg->communicator();
        check_all_reduce(comm, at::kFloat, 10, ddp::ReduceOp::kSum);
        if (rank == 0) std::_Exit(0);
        std::this_thread::sleep_for(500ms);  // rank 0's process, and its store, are gone by then
        const std::string message = report_of_an_all_reduce_without_rank_zero(comm);
        require_contains(message, "all_reduce #2");
        require_contains(message, "is gone: rank 0 has exited");
      },
      options);
  expect_all_succeeded(outcomes);
}

TEST(GlooFailures, CollectivesInADifferentOrderAreReported) {
  const auto outcomes = run_ranks(2, [](int rank) {
    // Rank 1's timeout is far longer: its broadcast waits for rank 0 too,
    // and must not fail first (ending rank 0's all_gather as a lost peer).
    auto pg = init_gloo(std::chrono::seconds(rank == 0 ? 2 : 20));
    auto& comm = pg->communicator();
    check_all_reduce(comm, at::kFloat, 10, ddp::ReduceOp::kSum);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    at::Tensor tensor = at::ones({1000});
    // Rank 1 is one collective behind: it issues a broadcast where rank 0 issues an all_gather.
    std::string message;
    try {
      if (rank == 0) {
        at::Tensor output = at::empty({2000});
        comm.all_gather(output, tensor)->wait();
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        comm.broadcast(tensor, 0)->wait();
      }
    } catch (const ddp::CollectiveError& e) {
      message = e.what();
    }
    // Rank 0 waits in vain for rank 1's share and must say the ranks
    // diverged; rank 1's broadcast fails once rank 0 has given up.
    if (rank == 0) {
      require_contains(message, "timed out");
      require_contains(message, "rank(s) 1 issued a different collective as #2");
    }
  });
  expect_all_succeeded(outcomes);
}

// With DDP_CHECK_COLLECTIVES, collectives that differ between ranks are
// named on every rank before they run: sizes that differ (which Gloo would
// pair, giving wrong data) and operations that differ (a timeout, or wrong data).
TEST(GlooFailures, CollectivesThatDifferAreNamedByTheCheck) {
  RunOptions options;
  options.env["DDP_CHECK_COLLECTIVES"] = "1";
  expect_all_succeeded(run_ranks(2, [](int rank) {
    auto pg = init_gloo(std::chrono::seconds(5));
    auto& comm = pg->communicator();
    check_all_reduce(comm, at::kFloat, 10, ddp::ReduceOp::kSum);  // the same on both: checked, and right
    at::Tensor input = at::ones({rank == 0 ? 1000 : 500}), output = at::empty({2 * input.numel()});
    std::string message = collective_error_of([&] { comm.all_gather(output, input)->wait(); });
    require_contains(message, "the ranks were about to issue different collectives");
    require_contains(message, "rank 0: all_gather #4 (1000 x Float)");
    require_contains(message, "rank 1: all_gather #4 (500 x Float)");
    message = collective_error_of([&] {
      if (rank == 0) {
        comm.all_gather(output, input)->wait();
      } else {
        comm.broadcast(input, 0)->wait();
      }
    });
    require_contains(message, "rank 0: all_gather #5 (1000 x Float)");
    require_contains(message, "rank 1: broadcast #5 (root 0, 500 x Float)");
    comm.barrier();  // the communicator still works after a refused collective
  }, options));
}

TEST(GlooFailures, ABadCheckCollectivesValueIsRefused) {
  expect_all_succeeded(run_ranks(1, [](int) {
    ::setenv("DDP_CHECK_COLLECTIVES", "yes", 1);
    require_usage_error([] { ddp::init(ddp::InitOptions().backend(ddp::Backend::kGloo)); },
                        "DDP_CHECK_COLLECTIVES must be 1 or 0, got 'yes'");
  }));
}

/// One process of a two-rank job: init() must give up within the timeout.
void expect_rendezvous_timeout(const ddp::InitOptions& init_options, const RunOptions& options) {
  expect_all_succeeded(run_ranks(1, [&init_options](int) {
    const auto start = Clock::now();
    try {
      ddp::init(init_options);
    } catch (const ddp::Error& e) {
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      require(seconds < 10, "rendezvous error after " + std::to_string(seconds) + " s");
      require_contains(e.what(), "MASTER_ADDR:MASTER_PORT");
      require_contains(e.what(), "all 2 ranks started");
      require(std::string(e.what()).find("frame #") == std::string::npos,
              std::string("a LibTorch backtrace in the error: ") + e.what());
      return;
    }
    throw std::runtime_error("init succeeded without the second rank");
  }, options));
}

TEST(GlooFailures, RendezvousTimesOutWhenARankNeverStarts) {
  RunOptions options;
  options.env["WORLD_SIZE"] = "2";
  expect_rendezvous_timeout(
      ddp::InitOptions().backend(ddp::Backend::kGloo).rendezvous_timeout(std::chrono::seconds(2)), options);
}

TEST(GlooFailures, RendezvousTimeoutComesFromTheLauncherVariable) {
  RunOptions options;
  options.env["WORLD_SIZE"] = "2";
  options.env["DDP_RDZV_TIMEOUT"] = "2";  // what ddprun --rdzv-timeout 2 passes
  expect_rendezvous_timeout(ddp::InitOptions().backend(ddp::Backend::kGloo), options);
}

// A timeout that would round to 0 ms (which the store takes as no limit) or
// overflow is refused by name before any rendezvous, as a bad value is.
TEST(GlooFailures, TimeoutVariablesOutOfRangeAreRefused) {
  expect_all_succeeded(run_ranks(1, [](int) {
    for (const std::string variable : {"DDP_RDZV_TIMEOUT", "DDP_TIMEOUT"}) {
      for (const std::string value : {"0.0004", "inf", "1e300", "-1", "2s"}) {
        ::setenv(variable.c_str(), value.c_str(), 1);
        require_usage_error([] { ddp::init(ddp::InitOptions().backend(ddp::Backend::kGloo)); },
                            variable + " must be a number of seconds from 0.001 to 31536000, got '" + value + "'");
        ::unsetenv(variable.c_str());
      }
    }
    // The same bounds for the options.
    require_usage_error(
        [] {
          ddp::init(ddp::InitOptions().backend(ddp::Backend::kGloo).timeout(std::chrono::milliseconds::max()));
        },
        "InitOptions::timeout must be from 1 ms to one year");
    require_usage_error(
        [] {
          ddp::init(ddp::InitOptions().backend(ddp::Backend::kGloo).rendezvous_timeout(std::chrono::milliseconds(0)));
        },
        "InitOptions::rendezvous_timeout must be from 1 ms to one year");
  }));
}

// A rank whose GLOO_SOCKET_IFNAME names no interface is told so in one line;
// the rank left waiting for it names itself and the connection it waited for
// within its timeout (both came as raw Gloo errors with backtraces).
TEST(GlooFailures, ARankThatCannotMakeItsGlooDeviceIsNamedOnEveryRank) {
  RunOptions options;
  options.rank_env[1] = {{"GLOO_SOCKET_IFNAME", "nonexistent0"}};
  expect_all_succeeded(run_ranks(
      2,
      [](int rank) {
        const auto init = [] {
          ddp::init(ddp::InitOptions().backend(ddp::Backend::kGloo).timeout(std::chrono::seconds(3)));
        };
        if (rank == 1) {
          require_usage_error(init, "rank 1: GLOO_SOCKET_IFNAME=nonexistent0 names no network interface");
          return;
        }
        try {
          init();
        } catch (const ddp::Error& e) {
          require_contains(e.what(),
                           "rank 0 of 2 could not connect the Gloo communicator to the other ranks within "
                           "3000 ms");
          require(std::string(e.what()).find('\n') == std::string::npos, "the message has more than one line");
          return;
        }
        throw std::runtime_error("rank 0 connected without rank 1");
      },
      options));
}

// Two jobs on one MASTER_PORT: a rank of job B that reaches job A's store
// fails at once, naming both jobs and the port, instead of joining job A.
TEST(GlooFailures, ARankOfAnotherJobIsRefusedAtRendezvous) {
  RunOptions options;
  options.env["DDP_RDZV_TIMEOUT"] = "3";
  options.rank_env[0] = {{"TORCHELASTIC_RUN_ID", "job-a"}};
  options.rank_env[1] = {{"TORCHELASTIC_RUN_ID", "job-b"}};
  const auto outcomes = run_ranks(
      2,
      [](int rank) {
        // The refusal is timed from when rank 0's store listens, not from rank 1's start.
        if (rank == 1) wait_until_listening(static_cast<std::uint16_t>(std::stoi(std::getenv("MASTER_PORT"))));
        const auto start = Clock::now();
        try {
          ddp::init(ddp::InitOptions().backend(ddp::Backend::kGloo));
        } catch (const ddp::UsageError& e) {
          const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
          require(rank == 1, std::string("rank 0 was refused: ") + e.what());
          require(seconds < 2, "refused after " + std::to_string(seconds) + " s");
          require_contains(e.what(), "rank 1: the rendezvous store at 127.0.0.1:");
          require_contains(e.what(),
                           "serves job 'job-a', not this rank's job 'job-b': two jobs use the same "
                           "MASTER_PORT");
          return;
        } catch (const ddp::Error& e) {
          require(rank == 0, std::string("rank 1 failed otherwise: ") + e.what());
          require_contains(e.what(), "only 1 of 2 ranks arrived");  // job A's rank 0 waits for its own rank 1
          return;
        }
        throw std::runtime_error("rank " + std::to_string(rank) + " joined a job of another identity");
      },
      options);
  expect_all_succeeded(outcomes);
}

}  // namespace
