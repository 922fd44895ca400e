// The rendezvous store of a single-node job is reachable from this machine only.

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <ddp/environment.h>
#include <ddp/errors.h>

#include "launcher/ports.h"
#include "runtime/rendezvous.h"

namespace {

/// Local addresses (kernel hex notation) of the sockets listening on `port`.
std::vector<std::string> listening_addresses(int port) {
  std::vector<std::string> addresses;
  char suffix_text[8];
  std::snprintf(suffix_text, sizeof suffix_text, ":%04X", port);
  const std::string suffix = suffix_text;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const bool on_port =
          local.size() > suffix.size() && local.compare(local.size() - suffix.size(), suffix.size(), suffix) == 0;
      if (on_port && state == "0A") addresses.push_back(local.substr(0, local.size() - suffix.size()));
    }
  }
  return addresses;
}

TEST(Rendezvous, LoopbackHostsAreRecognised) {
  EXPECT_TRUE(ddp::detail::is_loopback_host("127.0.0.1"));
  EXPECT_TRUE(ddp::detail::is_loopback_host("127.3.2.1"));
  EXPECT_TRUE(ddp::detail::is_loopback_host("::1"));
  EXPECT_TRUE(ddp::detail::is_loopback_host("localhost"));
  EXPECT_FALSE(ddp::detail::is_loopback_host("10.0.0.1"));
  EXPECT_FALSE(ddp::detail::is_loopback_host("0.0.0.0"));
}

TEST(Rendezvous, AStoreOnALoopbackAddressListensOnLoopbackOnly) {
  ddp::Environment env;
  env.master_addr = "127.0.0.1";
  env.master_port = static_cast<std::uint16_t>(ddp::launcher::free_port());
  env.run_id = "loopback-test";
  const auto store = ddp::detail::rendezvous(env, std::chrono::seconds(10));
  const std::vector<std::string> addresses = listening_addresses(env.master_port);
  ASSERT_FALSE(addresses.empty()) << "nothing listens on port " << env.master_port;
  for (const std::string& address : addresses) EXPECT_EQ(address, "0100007F") << "the store listens on " << address;
}

TEST(Rendezvous, AJobAcrossNodesNeedsAToken) {
  ddp::Environment env;
  env.world_size = 2;
  env.local_world_size = 1;
  env.master_addr = "127.0.0.1";
  env.master_port = static_cast<std::uint16_t>(ddp::launcher::free_port());
  try {
    ddp::detail::rendezvous(env, std::chrono::seconds(10));
    ADD_FAILURE() << "a job across nodes met without a secret";
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("DDP_RDZV_TOKEN is not set"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(listening_addresses(env.master_port).empty()) << "the store was served without a secret";
}

// Started without ddprun and without LOCAL_WORLD_SIZE (it defaults to
// WORLD_SIZE: "one node"), a job meeting at a routable address would serve
// its store on every interface: without a secret it is refused.
TEST(Rendezvous, AStoreReachableFromOtherHostsNeedsAToken) {
  ddp::Environment env;
  env.world_size = 2;
  env.local_world_size = 2;
  env.master_addr = "192.0.2.2";  // TEST-NET-1: never this host's, never contacted
  env.master_port = static_cast<std::uint16_t>(ddp::launcher::free_port());
  try {
    ddp::detail::rendezvous(env, std::chrono::seconds(10));
    ADD_FAILURE() << "a store reachable from other hosts was served without a secret";
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("DDP_RDZV_TOKEN is not set, and MASTER_ADDR=192.0.2.2 is not a loopback "
                                         "address: anyone who can reach 192.0.2.2:"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(listening_addresses(env.master_port).empty()) << "the store was served without a secret";
}

}  // namespace
