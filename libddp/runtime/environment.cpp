#include <ddp/environment.h>

#include <cerrno>
#include <cstdlib>
#include <limits>

#include <fmt/format.h>

#include <ddp/errors.h>

#include "runtime/store_wire.h"

namespace ddp {
namespace {

constexpr const char* kLaunchHint =
    "Start the program with ddprun (or torchrun), which sets RANK, WORLD_SIZE, LOCAL_RANK, "
    "LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, or set them yourself.";

using Lookup = std::function<std::optional<std::string>(const std::string&)>;

long parse_integer(const std::string& name, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE) {
    throw UsageError(fmt::format("{}='{}' is not an integer. {}", name, text, kLaunchHint));
  }
  return value;
}

std::string require(const Lookup& lookup, const std::string& name) {
  auto value = lookup(name);
  if (!value) {
    throw UsageError(fmt::format("{} is not set. {}", name, kLaunchHint));
  }
  return *value;
}

int integer_in_range(const std::string& name, const std::string& text, long low, long high) {
  const long value = parse_integer(name, text);
  if (value < low || value > high) {
    throw UsageError(fmt::format("{}={} is out of range: it must be in [{}, {}]. {}", name, value, low,
                                  high, kLaunchHint));
  }
  return static_cast<int>(value);
}

}  // namespace

Environment Environment::parse(const Lookup& lookup) {
  constexpr long kMaxInt = std::numeric_limits<int>::max();
  Environment env;
  env.world_size = integer_in_range("WORLD_SIZE", require(lookup, "WORLD_SIZE"), 1, kMaxInt);
  env.rank = integer_in_range("RANK", require(lookup, "RANK"), 0, kMaxInt);
  if (env.rank >= env.world_size) {
    throw UsageError(fmt::format("RANK={} must be smaller than WORLD_SIZE={}. {}", env.rank, env.world_size,
                                  kLaunchHint));
  }

  const auto local_world_size = lookup("LOCAL_WORLD_SIZE");
  env.local_world_size =
      local_world_size ? integer_in_range("LOCAL_WORLD_SIZE", *local_world_size, 1, env.world_size) : env.world_size;
  const auto local_rank = lookup("LOCAL_RANK");
  env.local_rank = local_rank ? integer_in_range("LOCAL_RANK", *local_rank, 0, kMaxInt) : env.rank;
  if (env.local_rank >= env.local_world_size) {
    throw UsageError(fmt::format("LOCAL_RANK={} must be smaller than LOCAL_WORLD_SIZE={}{}. {}", env.local_rank,
                                  env.local_world_size, local_world_size ? "" : " (taken from WORLD_SIZE)",
                                  kLaunchHint));
  }

  env.master_addr = require(lookup, "MASTER_ADDR");
  if (env.master_addr.empty()) {
    throw UsageError(fmt::format("MASTER_ADDR is empty: it must name the host of rank 0. {}", kLaunchHint));
  }
  env.master_port = static_cast<std::uint16_t>(integer_in_range("MASTER_PORT", require(lookup, "MASTER_PORT"), 1, 65535));
  env.run_id = lookup("TORCHELASTIC_RUN_ID").value_or("");
  env.rdzv_token = lookup("DDP_RDZV_TOKEN").value_or("");
  // Both travel in the store's hello, which the store reads only up to a
  // limit (what a stranger may make it read).
  const std::size_t given = env.run_id.size() + env.rdzv_token.size();
  const std::size_t framing = detail::store_wire::hello_frame("", "").size() - 4;
  if (framing + given > detail::store_wire::kMaxHelloFrame) {
    throw UsageError(fmt::format(
        "TORCHELASTIC_RUN_ID and DDP_RDZV_TOKEN are {} and {} bytes long; together they may have {}: use a shorter "
        "job name or token (16 random bytes in hex are plenty)",
        env.run_id.size(), env.rdzv_token.size(), detail::store_wire::kMaxHelloFrame - framing));
  }
  return env;
}

Environment Environment::from_env() {
  return parse([](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  });
}

}  // namespace ddp
