#include <ddp/sharding.h>

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include <ddp/errors.h>

namespace ddp {
namespace {

std::string human_bytes(std::int64_t bytes) {
  const double value = static_cast<double>(bytes);
  if (bytes >= (std::int64_t{1} << 30)) return fmt::format("{:.2f} GiB", value / (1 << 30));
  if (bytes >= (std::int64_t{1} << 20)) return fmt::format("{:.1f} MiB", value / (1 << 20));
  return fmt::format("{:.1f} KiB", value / (1 << 10));
}

}  // namespace

std::string to_string(Sharding sharding) {
  switch (sharding) {
    case Sharding::kNone: return "none";
    case Sharding::kOptimizer: return "optimizer";
    case Sharding::kGradients: return "gradients";
    case Sharding::kFull: return "full";
  }
  return "unknown";
}

Sharding parse_sharding(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (Sharding sharding : {Sharding::kNone, Sharding::kOptimizer, Sharding::kGradients, Sharding::kFull}) {
    if (lower == to_string(sharding)) return sharding;
  }
  throw UsageError(fmt::format("unknown sharding mode '{}'; choose none (plain DDP), optimizer (ZeRO-1: optimizer "
                               "state sharded), gradients (ZeRO-2: gradients too) or full (ZeRO-3: parameters too, unit by unit)",
                               name));
}

std::string MemoryReport::to_string() const {
  const std::string state = optimizer_state_bytes < 0                             ? std::string("unknown")
                            : optimizer_state_bytes == 0 && optimizer_elements > 0 ? std::string("none yet")
                                                                                    : human_bytes(optimizer_state_bytes);
  const std::string gathered =
      sharding == Sharding::kFull ? fmt::format(", units gathered at once at most {}", human_bytes(peak_gathered_bytes))
                                  : std::string();
  return fmt::format("memory per rank (sharding {}, {} ranks): parameters {}, gradients {}, optimizer state {}{}; "
                     "the optimizer steps {} of {} elements ({:.1f}%), padding {}",
                     ddp::to_string(sharding), world_size, human_bytes(parameter_bytes), human_bytes(gradient_bytes),
                     state, gathered, optimizer_elements, trained_elements,
                     trained_elements > 0 ? 100.0 * static_cast<double>(optimizer_elements) /
                                                static_cast<double>(trained_elements)
                                          : 0.0,
                     padding_elements);
}

}  // namespace ddp
