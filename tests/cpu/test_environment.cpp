// Parsing of the job environment, and the errors a user sees for bad values.

#include <map>
#include <string>

#include <gtest/gtest.h>
#include <c10/util/Exception.h>

#include <ddp/environment.h>
#include <ddp/errors.h>

namespace {

using Vars = std::map<std::string, std::string>;

ddp::Environment parse(const Vars& vars) {
  return ddp::Environment::parse([&](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

Vars valid() {
  return {{"RANK", "3"},          {"WORLD_SIZE", "8"},         {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}};
}

/// The error message for `vars`; fails the test if parsing succeeds.
std::string error_for(const Vars& vars) {
  try {
    parse(vars);
  } catch (const ddp::UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a UsageError";
  return {};
}

// libddp's one-line error messages quote a LibTorch reason without the
// backtrace c10::Error carries after it.
TEST(Errors, FirstLineOfKeepsOnlyTheReason) {
  EXPECT_EQ(ddp::first_line_of(std::runtime_error("the reason\nthe context")), "the reason");
  EXPECT_EQ(ddp::first_line_of(std::runtime_error("one line")), "one line");
  try {
    TORCH_CHECK(false, "LibTorch's reason");
  } catch (const c10::Error& e) {
    EXPECT_EQ(ddp::first_line_of(e), "LibTorch's reason") << e.what();
  }
}

TEST(Environment, ReadsEveryVariable) {
  const ddp::Environment env = parse(valid());
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "10.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
}

TEST(Environment, LocalVariablesDefaultToASingleNode) {
  Vars vars = valid();
  vars.erase("LOCAL_RANK");
  vars.erase("LOCAL_WORLD_SIZE");
  const ddp::Environment env = parse(vars);
  EXPECT_EQ(env.local_rank, 3);
  EXPECT_EQ(env.local_world_size, 8);
}

TEST(Environment, MissingVariableIsNamedWithHowToFixIt) {
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    Vars vars = valid();
    vars.erase(name);
    const std::string message = error_for(vars);
    EXPECT_NE(message.find(std::string(name) + " is not set"), std::string::npos) << message;
    EXPECT_NE(message.find("ddprun"), std::string::npos) << message;
  }
}

// Both travel in the store's hello, which the store reads only up to 4 KiB.
TEST(Environment, ARunIdAndTokenTooLongForTheStoresHelloAreRejected) {
  Vars vars = valid();
  vars["DDP_RDZV_TOKEN"] = std::string(4000, 'a');
  EXPECT_EQ(parse(vars).rdzv_token.size(), 4000u);
  vars["TORCHELASTIC_RUN_ID"] = std::string(100, 'j');
  const std::string message = error_for(vars);
  EXPECT_NE(message.find("TORCHELASTIC_RUN_ID and DDP_RDZV_TOKEN are 100 and 4000 bytes long; together they may "
                         "have 4076"),
            std::string::npos)
      << message;
}

TEST(Environment, NonNumericValuesAreRejected) {
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"}) {
    for (const char* text : {"abc", "", "3x", "1.5", "99999999999999999999"}) {
      Vars vars = valid();
      vars[name] = text;
      const std::string message = error_for(vars);
      EXPECT_NE(message.find(name), std::string::npos) << message;
    }
  }
}

TEST(Environment, OutOfRangeValuesAreRejected) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"RANK", "-1"},       {"WORLD_SIZE", "0"},       {"LOCAL_RANK", "-2"},   {"LOCAL_WORLD_SIZE", "0"},
      {"LOCAL_WORLD_SIZE", "9"}, {"MASTER_PORT", "0"}, {"MASTER_PORT", "65536"}};
  for (const auto& [name, value] : cases) {
    Vars vars = valid();
    vars[name] = value;
    const std::string message = error_for(vars);
    EXPECT_NE(message.find(name + "=" + value), std::string::npos) << message;
    EXPECT_NE(message.find("out of range"), std::string::npos) << message;
  }
}

TEST(Environment, RankMustBeBelowWorldSize) {
  Vars vars = valid();
  // A std::string, not the literal: GCC 12 at -O3 sees this one-character
  // assignment, inlined, as a copy of 2^63 bytes (-Wstringop-overflow).
  vars["RANK"] = std::string("8");
  const std::string message = error_for(vars);
  EXPECT_NE(message.find("RANK=8 must be smaller than WORLD_SIZE=8"), std::string::npos) << message;
}

TEST(Environment, LocalRankMustBeBelowLocalWorldSize) {
  Vars vars = valid();
  vars["LOCAL_RANK"] = std::string("2");  // as above
  const std::string message = error_for(vars);
  EXPECT_NE(message.find("LOCAL_RANK=2 must be smaller than LOCAL_WORLD_SIZE=2"), std::string::npos) << message;
}

TEST(Environment, EmptyMasterAddrIsRejected) {
  Vars vars = valid();
  vars["MASTER_ADDR"] = "";
  EXPECT_NE(error_for(vars).find("MASTER_ADDR is empty"), std::string::npos);
}

TEST(Environment, FromEnvReadsTheProcessEnvironment) {
  for (const auto& [name, value] : valid()) ::setenv(name.c_str(), value.c_str(), 1);
  EXPECT_EQ(ddp::Environment::from_env().rank, 3);
  ::unsetenv("RANK");
  EXPECT_THROW(ddp::Environment::from_env(), ddp::UsageError);
}

}  // namespace
