// The job store: what its clients can do, and what a stranger cannot.

#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <ddp/errors.h>

#include "comm/progress_board.h"
#include "comm/store_server_gone.h"
#include "launcher/ports.h"
#include "runtime/store_client.h"
#include "runtime/store_server.h"
#include "runtime/store_wire.h"

namespace ddp::detail {
namespace {

using namespace std::chrono_literals;

std::vector<std::uint8_t> bytes_of(const std::string& text) { return {text.begin(), text.end()}; }

struct Job {
  std::uint16_t port = static_cast<std::uint16_t>(launcher::free_port());
  std::shared_ptr<StoreServer> server =
      std::make_shared<StoreServer>(StoreServer::Options{"127.0.0.1", port, "job-a", "secret-a"});

  StoreClient::Address address() const { return {"127.0.0.1", port}; }
  std::unique_ptr<StoreClient> client(std::chrono::milliseconds timeout = 2000ms,
                                      const std::string& token = "secret-a") const {
    return std::make_unique<StoreClient>(address(), StoreClient::Credentials{"job-a", token}, timeout);
  }
};

/// A raw TCP connection to the store, as a stranger would open one.
class RawConnection {
 public:
  explicit RawConnection(std::uint16_t port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(port);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  }
  ~RawConnection() { ::close(fd_); }
  bool connected() const { return connected_; }
  void send(const std::vector<std::uint8_t>& bytes) const {
    ASSERT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
  }
  /// What the server sends until it closes the connection or `at_least`
  /// bytes came; closed() tells which. Gives up after `patience`.
  std::vector<std::uint8_t> read(std::size_t at_least = SIZE_MAX, std::chrono::milliseconds patience = 3000ms) {
    std::vector<std::uint8_t> received;
    const auto deadline = std::chrono::steady_clock::now() + patience;
    while (received.size() < at_least) {
      pollfd polled{fd_, POLLIN, 0};
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || ::poll(&polled, 1, static_cast<int>(left.count())) <= 0) break;
      std::uint8_t chunk[4096];
      const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
      if (n <= 0) {
        closed_ = true;
        break;
      }
      received.insert(received.end(), chunk, chunk + n);
    }
    return received;
  }
  bool closed() const { return closed_; }

 private:
  int fd_;
  bool connected_ = false;
  bool closed_ = false;
};

std::vector<std::uint8_t> get_request(const std::string& key) {
  return store_wire::Writer().u8(static_cast<std::uint8_t>(store_wire::Op::kGet)).blob(key).frame();
}

bool contains(const std::vector<std::uint8_t>& haystack, const std::string& needle) {
  return std::search(haystack.begin(), haystack.end(), needle.begin(), needle.end()) != haystack.end();
}

TEST(Store, ClientsShareKeysCountersAndWaits) {
  Job job;
  auto first = job.client();
  auto second = job.client();
  first->set("a", bytes_of("one"));
  EXPECT_EQ(second->get("a"), bytes_of("one"));
  EXPECT_EQ(first->add("n", 2), 2);
  EXPECT_EQ(second->add("n", 3), 5);
  EXPECT_EQ(first->get("n"), bytes_of("5")) << "counters read as decimal text, as TCPStore's";
  EXPECT_TRUE(second->check({"a", "n"}));
  EXPECT_FALSE(second->check({"a", "missing"}));
  EXPECT_FALSE(second->check({"missing", "a"})) << "a missing key before a present one";
  EXPECT_EQ(first->getNumKeys(), 2);
  EXPECT_EQ(first->compareSet("c", {}, bytes_of("x")), bytes_of("x")) << "a missing key expected missing is set";
  EXPECT_EQ(second->compareSet("c", bytes_of("y"), bytes_of("z")), bytes_of("x"))
      << "a wrong expectation changes nothing";
  EXPECT_EQ(second->compareSet("c", bytes_of("x"), bytes_of("z")), bytes_of("z"));
  EXPECT_TRUE(first->deleteKey("c"));
  EXPECT_FALSE(first->deleteKey("c"));

  // get and wait block until another client sets the key.
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    second->set("late", bytes_of("here"));
  });
  first->wait({"a", "late"});
  EXPECT_EQ(first->get("late"), bytes_of("here"));
  setter.join();
  auto cloned = first->clone();
  EXPECT_EQ(cloned->get("a"), bytes_of("one")) << "a clone reaches the same store";
}

TEST(Store, AWaitForAKeyThatNeverComesFailsAtItsDeadlineNamingTheKey) {
  Job job;
  auto client = job.client();
  const auto start = std::chrono::steady_clock::now();
  try {
    client->wait({"never"}, 300ms);
    ADD_FAILURE() << "the wait returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'never'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("within 300 ms"), std::string::npos) << e.what();
  }
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 290ms);
  EXPECT_LT(took, 2000ms);
  client->set("after", bytes_of("1"));  // the client reconnects after a timed-out request
  EXPECT_EQ(client->get("after"), bytes_of("1"));
}

// A failing rank's report tells a rank 0 that is gone (its store closed the
// connection, or nothing listens any more) from one that is stopped or hung
// (its port accepts, nobody answers): only the first is StoreServerGone.
TEST(Store, AStoreThatIsGoneIsToldFromOneThatDoesNotAnswer) {
  Job job;
  auto waiting = job.client();
  auto idle = job.client();
  idle->set("a", bytes_of("one"));
  std::thread exit_rank_zero([&] {
    std::this_thread::sleep_for(200ms);
    job.server.reset();
  });
  EXPECT_THROW(waiting->wait({"never"}, 5000ms), StoreServerGone) << "the server closed the connection";
  exit_rank_zero.join();
  EXPECT_THROW(idle->get("a"), StoreServerGone) << "the server reset the connection";
  EXPECT_THROW(job.client(300ms), StoreServerGone) << "nothing listens there";

  // Listening, never accepting: the kernel completes the connection, the hello gets no answer.
  const auto stopped = launcher::ReservedPort::on_loopback();
  try {
    StoreClient({"127.0.0.1", static_cast<std::uint16_t>(stopped.port())}, {"job-a", "secret-a"}, 300ms);
    ADD_FAILURE() << "a store that does not answer let the client in";
  } catch (const StoreServerGone& e) {
    ADD_FAILURE() << "a store that does not answer was called gone: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did not answer this rank's hello"), std::string::npos) << e.what();
  }
}

// The watchdog publishes its rank's progress between its checks of the
// collectives' deadlines: once rank 0, and with it the store, is gone, a
// publish returns at once instead of trying to reconnect for the store's
// whole timeout while a collective's deadline passes unseen.
TEST(Store, ProgressIsNoLongerPublishedOnceTheStoreIsGone) {
  Job job;
  const auto client = [&job](std::chrono::milliseconds timeout) {
    return c10::intrusive_ptr<c10d::Store>(
        c10::make_intrusive<StoreClient>(job.address(), StoreClient::Credentials{"job-a", "secret-a"}, timeout));
  };
  ProgressBoard board(client(20000ms), "progress/", 1, 2, [&client] { return client(3000ms); });
  const auto progress = [](std::uint64_t issued) { return Progress{issued, "all_reduce", issued - 1, "all_reduce"}; };
  board.publish(progress(1));
  EXPECT_EQ(job.client()->get("progress/1"), bytes_of("1 all_reduce 0 all_reduce"));
  job.server.reset();
  for (std::uint64_t issued = 2; issued < 6; ++issued) {
    const auto start = std::chrono::steady_clock::now();
    board.publish(progress(issued));
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    EXPECT_LT(took.count(), 1.0) << "publish #" << issued << " took " << took.count() << " s";
  }
}

TEST(Store, AClientWithTheWrongTokenOrOfAnotherJobIsRefusedNamingWhy) {
  Job job;
  try {
    job.client(2000ms, "guess");
    ADD_FAILURE() << "a wrong token was let in";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("refused this rank's DDP_RDZV_TOKEN"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("secret-a"), std::string::npos) << "the secret leaked: " << e.what();
  }
  try {
    StoreClient(job.address(), StoreClient::Credentials{"job-b", "secret-a"}, 2000ms);
    ADD_FAILURE() << "a client of another job was let in";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("the rendezvous store at 127.0.0.1:" + std::to_string(job.port) +
                                         " serves job 'job-a', not this rank's job 'job-b'"),
              std::string::npos)
        << e.what();
  }
}

TEST(Store, AStrangerIsReadNoFurtherThanItsHelloAndTheJobGoesOn) {
  Job job;
  auto client = job.client();
  client->set("secret-key", bytes_of("secret-value"));

  {  // A request without a hello is taken as a bad hello: no value comes back.
    RawConnection stranger(job.port);
    ASSERT_TRUE(stranger.connected());
    stranger.send(get_request("secret-key"));
    const auto reply = stranger.read();
    EXPECT_TRUE(stranger.closed());
    EXPECT_FALSE(contains(reply, "secret-value"));
  }
  {  // The wrong token, then a request: refused and closed; the request is never answered.
    RawConnection stranger(job.port);
    std::vector<std::uint8_t> bytes = store_wire::hello_frame("job-a", "wrong");
    const auto request = get_request("secret-key");
    bytes.insert(bytes.end(), request.begin(), request.end());
    stranger.send(bytes);
    const auto reply = stranger.read();
    EXPECT_TRUE(stranger.closed());
    ASSERT_GE(reply.size(), 5u);
    EXPECT_EQ(reply[4], static_cast<std::uint8_t>(store_wire::Verdict::kWrongToken));
    EXPECT_FALSE(contains(reply, "secret-value"));
  }
  {  // Garbage announcing a huge frame is dropped at once, not buffered.
    RawConnection stranger(job.port);
    stranger.send(std::vector<std::uint8_t>{0xff, 0xff, 0xff, 0x7f, 'G', 'E', 'T'});
    EXPECT_TRUE(stranger.read().empty());
    EXPECT_TRUE(stranger.closed());
  }
  {  // The right token opens the store: the test can fail.
    RawConnection member(job.port);
    std::vector<std::uint8_t> bytes = store_wire::hello_frame("job-a", "secret-a");
    const auto request = get_request("secret-key");
    bytes.insert(bytes.end(), request.begin(), request.end());
    member.send(bytes);
    // The verdict (4 + 1 + 4 + 5 bytes), then the value's frame (4 + 4 + 12).
    const auto reply = member.read(14 + 20);
    EXPECT_TRUE(contains(reply, "secret-value")) << "the hello of a member opens the store";
    EXPECT_FALSE(member.closed());
  }
  EXPECT_EQ(client->get("secret-key"), bytes_of("secret-value")) << "strangers do not disturb the job";
}

// A member's malformed get of a missing key (bytes after the key) is refused
// at once; parked, it was answered by the next set of the key, and the error
// then ended the setting client's connection instead.
TEST(Store, AMalformedWaitingRequestEndsOnlyItsOwnConnection) {
  Job job;
  RawConnection member(job.port);
  std::vector<std::uint8_t> bytes = store_wire::hello_frame("job-a", "secret-a");
  const auto request = store_wire::Writer().u8(static_cast<std::uint8_t>(store_wire::Op::kGet)).blob("k").u8(0).frame();
  bytes.insert(bytes.end(), request.begin(), request.end());
  member.send(bytes);
  member.read(SIZE_MAX, 1000ms);
  EXPECT_TRUE(member.closed()) << "the malformed request was kept";
  auto client = job.client();
  client->set("k", bytes_of("v"));
  EXPECT_EQ(client->get("k"), bytes_of("v")) << "the setting client's connection was ended";
}

// Strangers who open connection after connection and never say hello hold
// at most a bounded number of the server's descriptors: with this process
// limited to 512, 320 of them still leave room for a member. (The server
// took them all, ran out of descriptors and never read the member's hello.)
TEST(Store, AFloodOfSilentConnectionsLeavesRoomForTheJob) {
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  if (saved.rlim_max < 512) GTEST_SKIP() << "the hard limit on open files is below 512";
  rlimit low = saved;
  low.rlim_cur = 512;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  {
    Job job;
    std::vector<std::unique_ptr<RawConnection>> strangers;
    for (int i = 0; i < 320; ++i) strangers.push_back(std::make_unique<RawConnection>(job.port));
    std::this_thread::sleep_for(500ms);  // the server accepts them
    auto member = job.client(3000ms);
    member->set("key", bytes_of("value"));
    EXPECT_EQ(member->get("key"), bytes_of("value"));
  }
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
}

// Served without a token (on loopback, every rank on one node), the store
// lets in this user's processes and refuses another user's, naming why.
class StoreWithoutAToken : public ::testing::TestWithParam<const char*> {};

TEST_P(StoreWithoutAToken, LetsInOnlyThisUsersProcesses) {
  const StoreClient::Address address{GetParam(), static_cast<std::uint16_t>(launcher::free_port())};
  std::shared_ptr<StoreServer> server;
  try {
    server = std::make_shared<StoreServer>(StoreServer::Options{address.host, address.port, "job-a", ""});
  } catch (const Error& e) {
    GTEST_SKIP() << "this host cannot listen on " << address.host << ": " << e.what();
  }
  StoreClient member(address, StoreClient::Credentials{"job-a", ""}, 2000ms);
  member.set("key", bytes_of("value"));
  EXPECT_EQ(member.get("key"), bytes_of("value"));

  if (::geteuid() != 0) GTEST_SKIP() << "connecting as another user needs root";
  const pid_t child = ::fork();
  if (child == 0) {
    int outcome = 1;
    if (::setgid(65534) == 0 && ::setuid(65534) == 0) {
      try {
        StoreClient stranger(address, StoreClient::Credentials{"job-a", ""}, 2000ms);
        outcome = 2;
      } catch (const UsageError& e) {
        outcome =
            std::string(e.what()).find("lets in only the processes of the user who started rank 0") != std::string::npos
                ? 0
                : 3;
      } catch (...) {
        outcome = 4;
      }
    }
    ::_exit(outcome);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 1) {
    GTEST_SKIP() << "root here cannot become user 65534 (a user namespace, or no CAP_SETUID)";
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "another user's process: exit " << WEXITSTATUS(status)
      << " (2: let in, 3: refused for another reason, 4: another error)";
  EXPECT_EQ(member.get("key"), bytes_of("value")) << "the refusal disturbed the job";
}

INSTANTIATE_TEST_SUITE_P(Loopback, StoreWithoutAToken, ::testing::Values("127.0.0.1", "::1"),
                         [](const auto& info) { return std::string(info.param) == "::1" ? "IPv6" : "IPv4"; });

}  // namespace
}  // namespace ddp::detail
