#include <ddp/process_group.h>

#include <cstdlib>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/cuda.h>

#include <ddp/errors.h>

#include "comm/backends.h"

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
  if (*text == '\0' || *end != '\0' || !(seconds > 0)) {
    throw UsageError(fmt::format("{} must be a positive number of seconds, got '{}'", name, text));
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

std::chrono::milliseconds choose_rendezvous_timeout(const InitOptions& options) {
  if (options.rendezvous_timeout()) return *options.rendezvous_timeout();
  return seconds_from_env("DDP_RDZV_TIMEOUT").value_or(std::chrono::minutes(5));
}

std::chrono::milliseconds choose_timeout(const InitOptions& options) {
  if (options.timeout()) {
    if (options.timeout()->count() <= 0) {
      throw UsageError(fmt::format("InitOptions::timeout must be positive, got {} ms", options.timeout()->count()));
    }
    return *options.timeout();
  }
  return seconds_from_env("DDP_TIMEOUT").value_or(std::chrono::minutes(10));
}

/// How long a failing rank's report waits for the store: a few seconds, so
/// that a stopped rank 0 (which serves it) is named soon after the timeout.
constexpr std::chrono::seconds kReportStoreTimeout{5};

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

std::string read_string(c10d::Store& store, const std::string& key) {
  const std::vector<uint8_t> bytes = store.get(key);
  return std::string(bytes.begin(), bytes.end());
}

/// Every rank connects to rank 0's TCP store, then waits until all
/// WORLD_SIZE ranks have checked in, all within `timeout`. The check-in is
/// done here rather than by the store so that the wait is bounded on every
/// LibTorch version and the error can say how many ranks arrived.
c10::intrusive_ptr<c10d::Store> rendezvous(const Environment& env, std::chrono::milliseconds timeout) {
  const auto fail = [&](std::string what) {
    what = what.substr(0, what.find('\n'));  // LibTorch's reason, without its backtrace
    return Error(fmt::format(
        "libddp: rank {} could not meet the other ranks through the store at MASTER_ADDR:MASTER_PORT = {}:{} "
        "within {} ms: {}\nRank 0 serves this store: check that all {} ranks started with the same MASTER_ADDR "
        "and MASTER_PORT, that rank 0's host is reachable from here, and that the port is free on rank 0's host.",
        env.rank, env.master_addr, env.master_port, timeout.count(), what, env.world_size));
  };
  c10d::TCPStoreOptions options;
  options.port = env.master_port;
  options.isServer = env.rank == 0;
  options.numWorkers = static_cast<std::size_t>(env.world_size);
  options.waitWorkers = false;
  options.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
  } catch (const std::exception& e) {
    throw fail(e.what());
  }

  const std::string world_key = "ddp/rendezvous/world_size";
  const std::string run_key = "ddp/rendezvous/run_id";
  const std::string count_key = "ddp/rendezvous/joined";
  const std::string done_key = "ddp/rendezvous/complete";
  try {
    if (env.rank == 0) {
      // The job's identity first: a rank that sees the world size sees it too.
      store->set(run_key, std::vector<uint8_t>(env.run_id.begin(), env.run_id.end()));
      const std::string world = std::to_string(env.world_size);
      store->set(world_key, std::vector<uint8_t>(world.begin(), world.end()));
    } else {
      store->wait({world_key}, timeout);
      // Before this rank counts itself in: a rank of another job that reached
      // this store (two jobs on one MASTER_PORT) must not join it.
      const std::string run = read_string(*store, run_key);
      if (run != env.run_id) {
        const auto shown = [](const std::string& id) { return id.empty() ? std::string("<unset>") : "'" + id + "'"; };
        throw UsageError(fmt::format(
            "rank {} of job {} reached the rendezvous store at {}:{}, which serves job {}: two jobs use the same "
            "MASTER_PORT. Give each job its own port (ddprun --standalone picks a free one) and start every rank "
            "of a job with the same TORCHELASTIC_RUN_ID (ddprun sets it; --rdzv-id chooses it).",
            env.rank, shown(env.run_id), env.master_addr, env.master_port, shown(run)));
      }
      const std::string world = read_string(*store, world_key);
      if (world != std::to_string(env.world_size)) {
        throw UsageError(fmt::format("WORLD_SIZE differs between ranks: rank 0 has {}, rank {} has {}. Start every "
                                     "rank with the same WORLD_SIZE.",
                                     world, env.rank, env.world_size));
      }
    }
    if (store->add(count_key, 1) == env.world_size) store->set(done_key, std::vector<uint8_t>{1});
    store->wait({done_key}, timeout);
  } catch (const UsageError&) {
    throw;
  } catch (const std::exception& e) {
    std::int64_t joined = -1;
    try {
      joined = store->add(count_key, 0);
    } catch (...) {
    }
    throw fail(joined >= 0 ? fmt::format("only {} of {} ranks arrived ({})", joined, env.world_size, e.what())
                           : std::string(e.what()));
  }
  return store;
}

std::shared_ptr<Communicator> make_communicator(Backend backend, const detail::CommunicatorBase::Setup& setup,
                                               int local_rank) {
  switch (backend) {
#ifdef DDP_WITH_NCCL
    case Backend::kNccl: return detail::make_nccl_communicator(setup, local_rank);
#endif
#ifdef DDP_WITH_GLOO
    case Backend::kGloo: return detail::make_gloo_communicator(setup);
#endif
    default: break;
  }
  (void)local_rank;
  throw UsageError("libddp was built without the " + to_string(backend) + " backend");
}

}  // namespace

std::shared_ptr<ProcessGroup> init(const InitOptions& options) {
  auto state = std::make_shared<ProcessGroup::State>();
  state->environment = Environment::from_env();
  const Environment& env = state->environment;
  const Backend backend = choose_backend(options);
  check_backend_usable(backend, env);
  const std::chrono::milliseconds timeout = choose_timeout(options);

  state->store = rendezvous(env, choose_rendezvous_timeout(options));
  detail::CommunicatorBase::Setup setup;
  setup.rank = env.rank;
  setup.world_size = env.world_size;
  setup.timeout = timeout;
  setup.store = state->store;
  setup.reconnect = [address = env.master_addr, port = env.master_port]() -> c10::intrusive_ptr<c10d::Store> {
    c10d::TCPStoreOptions client;
    client.port = port;
    client.isServer = false;
    client.waitWorkers = false;
    client.timeout = kReportStoreTimeout;
    return c10::make_intrusive<c10d::TCPStore>(address, client);
  };
  setup.name = "world";
  state->communicator = make_communicator(backend, setup, env.local_rank);
  return std::make_shared<ProcessGroup>(std::move(state));
}

}  // namespace ddp
