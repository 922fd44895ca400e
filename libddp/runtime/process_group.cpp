#include <ddp/process_group.h>

#include <cstdlib>

#include <fmt/format.h>
#include <torch/cuda.h>

#include <ddp/errors.h>

#include "comm/backends.h"
#include "runtime/rendezvous.h"
#include "runtime/store_client.h"

namespace ddp {

struct ProcessGroup::State {
  Environment environment;
  c10::intrusive_ptr<c10d::Store> store;
  std::shared_ptr<Communicator> communicator;
};

ProcessGroup::ProcessGroup(std::shared_ptr<State> state) : state_(std::move(state)) {}
ProcessGroup::~ProcessGroup() = default;
const Environment& ProcessGroup::environment() const { return state_->environment; }
Communicator& ProcessGroup::communicator() const { return *state_->communicator; }

namespace {

Backend choose_backend(const InitOptions& options) {
  if (options.backend()) return *options.backend();
  if (const char* name = std::getenv("DDP_BACKEND")) {
    try {
      return parse_backend(name);
    } catch (const UsageError& e) {
      throw UsageError(fmt::format("DDP_BACKEND: {}", e.what()));
    }
  }
  return is_available(Backend::kNccl) && torch::cuda::is_available() ? Backend::kNccl : Backend::kGloo;
}

/// A duration set in seconds by the variable `name`, if it is set.
std::optional<std::chrono::milliseconds> seconds_from_env(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr) return std::nullopt;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  // At least a millisecond (shorter would round to 0, which the store takes
  // as no limit) and at most a year (longer overflows the milliseconds).
  constexpr double kLongest = 365.0 * 24 * 3600;
  if (*text == '\0' || *end != '\0' || !(seconds >= 0.001 && seconds <= kLongest)) {
    throw UsageError(fmt::format("{} must be a number of seconds from 0.001 to {:.0f}, got '{}'", name, kLongest, text));
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

/// `chosen`, if it is from 1 ms to a year (0 would mean no limit to the
/// store, and more than a year overflows the deadlines).
std::chrono::milliseconds within_bounds(std::chrono::milliseconds chosen, const char* option) {
  if (chosen < std::chrono::milliseconds(1) || chosen > std::chrono::hours(24 * 365)) {
    throw UsageError(fmt::format("InitOptions::{} must be from 1 ms to one year, got {} ms", option, chosen.count()));
  }
  return chosen;
}

std::chrono::milliseconds choose_rendezvous_timeout(const InitOptions& options) {
  if (options.rendezvous_timeout()) return within_bounds(*options.rendezvous_timeout(), "rendezvous_timeout");
  return seconds_from_env("DDP_RDZV_TIMEOUT").value_or(std::chrono::minutes(5));
}

std::chrono::milliseconds choose_timeout(const InitOptions& options) {
  if (options.timeout()) return within_bounds(*options.timeout(), "timeout");
  return seconds_from_env("DDP_TIMEOUT").value_or(std::chrono::minutes(10));
}

/// `chosen` if set, else the variable `name` (1 or 0), else off.
bool switch_from(const std::optional<bool>& chosen, const char* name) {
  if (chosen) return *chosen;
  const char* text = std::getenv(name);
  if (text == nullptr) return false;
  const std::string value = text;
  if (value != "0" && value != "1") throw UsageError(fmt::format("{} must be 1 or 0, got '{}'", name, value));
  return value == "1";
}

/// Whether large all-reduces take the copy engines (InitOptions::copy_engine_reductions).
bool choose_copy_engine_reductions(const InitOptions& options, Backend backend, const Environment& env) {
  if (!switch_from(options.copy_engine_reductions(), "DDP_COPY_ENGINE_REDUCTIONS")) return false;
  if (backend != Backend::kNccl) {
    throw UsageError(
        "copy-engine reductions move CUDA tensors between GPUs and need the NCCL backend; turn them "
        "off (DDP_COPY_ENGINE_REDUCTIONS=0) for " +
        to_string(backend));
  }
  if (env.local_world_size != env.world_size) {
    throw UsageError(
        fmt::format("copy-engine reductions need every rank on one node (WORLD_SIZE={}, "
                    "LOCAL_WORLD_SIZE={}); turn them off (DDP_COPY_ENGINE_REDUCTIONS=0) across nodes",
                    env.world_size, env.local_world_size));
  }
  return true;
}

/// How long a failing rank's report waits for the store: a few seconds, so
/// that a stopped rank 0 (which serves it) is named soon after the timeout;
/// under the report's own deadline (5 s), so that a store nothing serves any
/// more (connections refused till then) is told from one that stopped.
constexpr std::chrono::seconds kReportStoreTimeout{3};

void check_backend_usable(Backend backend, const Environment& env) {
  if (!is_available(backend)) {
    throw UsageError(fmt::format(
        "libddp was built without the {} backend ({}). Choose the other one with DDP_BACKEND or "
        "InitOptions::backend, or rebuild libddp against {}.",
        to_string(backend),
        backend == Backend::kNccl ? "its LibTorch has no CUDA" : "Gloo's headers were missing at build time",
        backend == Backend::kNccl ? "a LibTorch with CUDA" : "Gloo (Debian: libgloo-dev)"));
  }
  if (backend != Backend::kNccl) return;
  const auto gpus = static_cast<int>(torch::cuda::device_count());
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (gpus == 0) {
    throw UsageError(fmt::format("the NCCL backend needs a GPU, and none is visible (CUDA_VISIBLE_DEVICES={}). "
                                 "Use DDP_BACKEND=gloo to train on the CPU.",
                                 visible ? visible : "<unset>"));
  }
  if (env.local_rank >= gpus) {
    throw UsageError(fmt::format("LOCAL_RANK={} names a GPU this process cannot see: {} GPU(s) are visible "
                                 "(CUDA_VISIBLE_DEVICES={}). Start at most one process per GPU on each node "
                                 "(ddprun --nproc-per-node gpu).",
                                 env.local_rank, gpus, visible ? visible : "<unset>"));
  }
}

std::shared_ptr<Communicator> make_communicator(Backend backend, const detail::CommunicatorBase::Setup& setup,
                                                int local_rank, bool copy_engine_reductions) {
  switch (backend) {
#ifdef DDP_WITH_NCCL
    case Backend::kNccl: return detail::make_nccl_communicator(setup, local_rank, copy_engine_reductions);
#endif
#ifdef DDP_WITH_GLOO
    case Backend::kGloo: return detail::make_gloo_communicator(setup);
#endif
    default: break;
  }
  (void)local_rank;
  (void)copy_engine_reductions;
  throw UsageError("libddp was built without the " + to_string(backend) + " backend");
}

}  // namespace

std::shared_ptr<ProcessGroup> init(const InitOptions& options) {
  auto state = std::make_shared<ProcessGroup::State>();
  state->environment = Environment::from_env();
  const Environment& env = state->environment;
  const Backend backend = choose_backend(options);
  const bool copy_engine_reductions = choose_copy_engine_reductions(options, backend, env);
  check_backend_usable(backend, env);
  const std::chrono::milliseconds timeout = choose_timeout(options);
  const bool check_collectives = switch_from(options.check_collectives(), "DDP_CHECK_COLLECTIVES");

  state->store = detail::rendezvous(env, choose_rendezvous_timeout(options));
  detail::CommunicatorBase::Setup setup;
  setup.rank = env.rank;
  setup.world_size = env.world_size;
  setup.timeout = timeout;
  setup.store = state->store;
  setup.reconnect = [address = detail::StoreClient::Address{env.master_addr, env.master_port},
                     credentials = detail::StoreClient::Credentials{env.run_id, env.rdzv_token}] {
    return c10::intrusive_ptr<c10d::Store>(
        c10::make_intrusive<detail::StoreClient>(address, credentials, kReportStoreTimeout));
  };
  setup.name = "world";
  setup.check_collectives = check_collectives;
  state->communicator = make_communicator(backend, setup, env.local_rank, copy_engine_reductions);
  return std::make_shared<ProcessGroup>(std::move(state));
}

}  // namespace ddp
