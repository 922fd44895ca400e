#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace ddp::detail {

class StoreServer;

/// A connection to the job's store (StoreServer), as a c10d::Store, so that
/// LibTorch's process groups use it as they would a TCPStore. Every
/// operation has a deadline (the store's timeout; wait's own): a rank that
/// stopped answering is reported in bounded time, never waited for.
/// Thread-safe: one request at a time on one connection.
class StoreClient : public c10d::Store {
 public:
  struct Address {
    std::string host;
    std::uint16_t port = 0;
  };
  /// What the client presents before anything else: the job's name and secret.
  struct Credentials {
    std::string run_id;
    std::string token;
  };

  /// Connects within `timeout` (retrying while nothing listens yet) and
  /// presents the credentials. A store of another job, or one that refuses
  /// the token, is a UsageError that says so. Rank 0 passes its server,
  /// which then lives as long as this client (and its clones).
  StoreClient(Address address, Credentials credentials, std::chrono::milliseconds timeout,
              std::shared_ptr<StoreServer> server = nullptr);
  ~StoreClient() override;

  void set(const std::string& key, const std::vector<std::uint8_t>& value) override;
  std::vector<std::uint8_t> compareSet(const std::string& key, const std::vector<std::uint8_t>& expected,
                                       const std::vector<std::uint8_t>& desired) override;
  /// Waits (up to the timeout) until the key exists, as TCPStore's get does.
  std::vector<std::uint8_t> get(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  std::int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  /// A second connection to the same store (LibTorch 2.x's Store::clone;
  /// 1.13's Store has no such member, hence no `override`).
  c10::intrusive_ptr<c10d::Store> clone();

 private:
  /// Sends one request and returns its reply's payload (none where the
  /// operation is not `replied`); `what` names it in errors.
  std::vector<std::uint8_t> request(const std::vector<std::uint8_t>& frame, std::chrono::milliseconds timeout,
                                    const std::string& what, bool replied = true);
  void connect(std::chrono::milliseconds timeout);
  void disconnect();

  Address address_;
  Credentials credentials_;
  std::shared_ptr<StoreServer> server_;
  std::mutex mutex_;
  int fd_ = -1;  ///< -1 after a failed request: its reply may still come, so the next one reconnects.
};

}  // namespace ddp::detail
