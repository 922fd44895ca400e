// Training throughput of a bundled model under libddp, one configuration per
// run; benchmarks/scaling/run_scaling.py runs it at 1..N GPUs beside PyTorch
// DDP (pytorch_ddp.py) and writes the report.
//
//   ddprun --nproc-per-node gpu build/benchmarks/scaling/scaling_bench --model llama --precision bf16 --json rows.jsonl
//
// The step is the examples' (train_resnet50, train_llama: same model,
// optimizer, precision policy and loss) on one synthetic batch made once on
// the device, so the input pipeline is not measured. Timing, the same as
// pytorch_ddp.py's: `--warmup` untimed steps, then `--steps` timed ones
// between two device synchronisations and barriers; throughput is the items
// of all ranks over that wall time. Events on the training stream at the
// start of each step, after forward and loss, after backward (when the stream
// may use the averaged gradients) and after the optimizer step give the
// phase times, read only after the run so they add no synchronisation.
// Exposed communication comes from the DDP timeline: the part of the
// reductions' device time left after the last backward kernel.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <torch/version.h>

#ifdef BENCH_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <torch/csrc/autograd/profiler_kineto.h>

#include <ddp/ddp.h>

#include "flags.h"
#include "fused_ops.h"
#include "llama_model.h"
#include "llama_training.h"
#include "progress.h"
#include "resnet.h"
#include "resnet_training.h"

extern char** environ;  // POSIX: the process's environment

namespace {

/// --unfuse's comma-separated names, each one of `known` (`model`'s fusions).
std::set<std::string> fusions_to_leave_out(const examples::Flags& flags, const std::set<std::string>& known,
                                           const std::string& model) {
  const std::string list = flags.str("unfuse");
  std::set<std::string> names;
  for (std::size_t start = 0, end = 0; start < list.size(); start = end + 1) {
    end = std::min(list.find(',', start), list.size());
    const std::string name = list.substr(start, end - start);
    if (known.count(name) == 0) {
      flags.fail(
          fmt::format("--unfuse for {} takes {}, comma-separated; got '{}'", model, fmt::join(known, ", "), name));
    }
    names.insert(name);
  }
  return names;
}

/// `text` as a JSON string literal.
std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

/// The NCCL_* variables this run saw, as a JSON object: a row says which NCCL
/// settings it was measured under (the launcher passes the environment through).
std::string nccl_environment_json() {
  std::vector<std::string> entries;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string variable = *entry;
    const auto equals = variable.find('=');
    if (variable.rfind("NCCL_", 0) != 0 || equals == std::string::npos) continue;
    entries.push_back(json_string(variable.substr(0, equals)) + ": " + json_string(variable.substr(equals + 1)));
  }
  std::sort(entries.begin(), entries.end());
  return fmt::format("{{{}}}", fmt::join(entries, ", "));
}

/// One training step split into the phases the report shows (between
/// forward_loss and optimizer_step: loss.backward()).
struct Step {
  std::function<at::Tensor()> forward_loss;
  std::function<void()> optimizer_step;
  std::shared_ptr<torch::optim::Optimizer> optimizer;
  /// The DDP timeline's exposed communication of each reduced backward so far.
  std::function<std::vector<double>()> exposed_communication_ms;
};

/// Marks points of the steps on the training stream: CUDA events on a GPU
/// (read after the run, so marking never waits for the device), the host
/// clock on the CPU, where every op has finished when it returns.
class StepClock {
 public:
  StepClock(const c10::Device& device, std::size_t marks) : on_gpu_(device.is_cuda()) {
#ifdef BENCH_WITH_CUDA
    if (on_gpu_) {
      events_.resize(marks);
      for (auto& event : events_) check(cudaEventCreate(&event), "cudaEventCreate");
    }
#endif
    host_.reserve(marks);
  }
  ~StepClock() {
#ifdef BENCH_WITH_CUDA
    for (auto event : events_) cudaEventDestroy(event);
#endif
  }
  StepClock(const StepClock&) = delete;
  StepClock& operator=(const StepClock&) = delete;

  void mark() {
#ifdef BENCH_WITH_CUDA
    if (on_gpu_) {
      check(cudaEventRecord(events_.at(marked_++), c10::cuda::getCurrentCUDAStream().stream()), "cudaEventRecord");
      return;
    }
#endif
    host_.push_back(std::chrono::steady_clock::now());
    ++marked_;
  }

  /// Milliseconds from mark i to mark i + 1; the device must have reached the last mark.
  double interval_ms(std::size_t i) const {
#ifdef BENCH_WITH_CUDA
    if (on_gpu_) {
      float ms = 0;
      check(cudaEventElapsedTime(&ms, events_.at(i), events_.at(i + 1)), "cudaEventElapsedTime");
      return ms;
    }
#endif
    return std::chrono::duration<double, std::milli>(host_.at(i + 1) - host_.at(i)).count();
  }

 private:
#ifdef BENCH_WITH_CUDA
  static void check(cudaError_t status, const char* call) {
    if (status != cudaSuccess) throw std::runtime_error(fmt::format("{} failed: {}", call, cudaGetErrorString(status)));
  }
  std::vector<cudaEvent_t> events_;
#endif
  bool on_gpu_;
  std::size_t marked_ = 0;
  std::vector<std::chrono::steady_clock::time_point> host_;
};

void synchronize(ddp::ProcessGroup& process_group) {
#ifdef BENCH_WITH_CUDA
  if (process_group.device().is_cuda()) {
    const auto status = cudaDeviceSynchronize();
    if (status != cudaSuccess) throw std::runtime_error(std::string("cudaDeviceSynchronize failed: ") + cudaGetErrorString(status));
  }
#endif
  process_group.communicator().barrier();
}

/// Runs `step` once under LibTorch's (Kineto) profiler and writes the
/// Chrome trace of every operator and GPU kernel to `path`; Perfetto opens it,
/// and kernel_diff.py compares it with pytorch_ddp.py's trace of the same step.
/// An empty `path` records nothing: run before a CUDA graph is recorded, it
/// loads CUPTI, whose loading later would leave the graph's kernels out of
/// the trace (what torch.profiler's _init_for_cuda_graphs does).
void write_profile_trace(const std::function<void()>& step, const c10::Device& device, const std::string& path) {
  namespace profiler = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  std::set<ActivityType> activities{ActivityType::CPU};
  if (device.is_cuda()) activities.insert(ActivityType::CUDA);
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
  step();
  const auto result = profiler::disableProfiler();
  if (!path.empty()) result->save(path);
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double mean(const std::vector<double>& values) {
  return values.empty() ? 0 : std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
}

/// Largest value over the ranks.
double max_over_ranks(ddp::ProcessGroup& process_group, double value) {
  at::Tensor t = torch::full({1}, value, torch::TensorOptions().dtype(torch::kDouble).device(process_group.device()));
  process_group.communicator().all_reduce(t, ddp::ReduceOp::kMax)->wait();
  return t.cpu().item<double>();
}

struct Workload {
  Step step;
  std::string unit;           ///< "img/s" or "tok/s"
  double items_per_rank = 0;  ///< images or tokens of one rank's batch
  std::int64_t params = 0;
  double flops_per_item = 0;  ///< 0 where not reported
  std::string json_fields;    ///< model-specific fields of the result
};

/// A plain DDP training step of `ddp_model`: forward_loss, loss.backward(),
/// optimizer step, zero_grad; exposed communication from DDP's timeline. The
/// step's functions own the model, the optimizer and the data.
template <typename Model>
Step ddp_step(std::shared_ptr<ddp::DistributedDataParallel<Model>> ddp_model,
              std::shared_ptr<torch::optim::Optimizer> optimizer, std::function<at::Tensor()> forward_loss) {
  Step step;
  step.forward_loss = std::move(forward_loss);
  step.optimizer = optimizer;
  step.optimizer_step = [optimizer] {
    optimizer->step();
    optimizer->zero_grad();
  };
  step.exposed_communication_ms = [ddp_model] {
    std::vector<double> exposed;
    for (const auto& timing : ddp_model->timings()) exposed.push_back(timing.exposed_communication_ms);
    return exposed;
  };
  return step;
}

Workload resnet50_workload(const examples::Flags& flags, std::int64_t batch,
                           const std::shared_ptr<ddp::ProcessGroup>& process_group, const ddp::PrecisionPolicy& policy,
                           const ddp::DistributedDataParallelOptions& options) {
  resnet::check_precision(policy);
  const auto device = process_group->device();
  const std::int64_t image = flags.integer("image-size");
  const bool sync_bn = flags.on("sync-bn");
  auto model = resnet::resnet50(1000, sync_bn ? process_group : nullptr);
  const ddp::FusedBatchNormPath path =
      flags.on("unfused") ? ddp::FusedBatchNormPath::kAten : resnet::parse_batch_norm_path(flags.str("bn"));
  model->set_batch_norm_path(path);
  const std::set<std::string> unfuse = fusions_to_leave_out(flags, {"max-pool", "shortcut-gradient"}, "ResNet-50");
  model->fused_max_pool = !flags.on("unfused") && unfuse.count("max-pool") == 0;
  model->set_join_shortcut_gradients(!flags.on("unfused") && unfuse.count("shortcut-gradient") == 0);
  model->to(device);
  resnet::to_channels_last(*model);
  auto ddp_model = std::make_shared<ddp::DistributedDataParallel<resnet::ResNet>>(model, process_group, options);
  std::shared_ptr<torch::optim::Optimizer> optimizer = resnet::make_sgd(*ddp_model, 0.1, 0.9, 5e-5);
  const auto on_device = torch::TensorOptions().device(device);
  const at::Tensor images = torch::randn({batch, 3, image, image}, on_device).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor labels = torch::randint(0, 1000, {batch}, on_device.dtype(torch::kLong));
  const double label_smoothing = 0.1;

  Workload workload;
  workload.step = ddp_step(ddp_model, optimizer, [=] {
    ddp::PrecisionGuard guard(policy, device);
    return torch::nn::functional::cross_entropy(
        (*ddp_model)(images), labels, torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(label_smoothing));
  });
  workload.unit = "img/s";
  workload.items_per_rank = static_cast<double>(batch);
  for (const auto& p : model->parameters()) workload.params += p.numel();
  workload.json_fields = fmt::format(
      "\"model\": \"resnet50\", \"preset\": null, \"seq\": null, \"image_size\": {}, \"fp8_scaling\": null, "
      "\"fp8_fast_accum\": null, \"fused_kernels\": {}, \"bn\": \"{}\", \"sync_bn\": {}, \"unfuse\": \"{}\"",
      image, path != ddp::FusedBatchNormPath::kAten && ddp::fused_batch_norm_path_built(path) && device.is_cuda(),
      flags.on("unfused") ? "aten" : flags.str("bn"), sync_bn, flags.str("unfuse"));
  return workload;
}

Workload llama_workload(const examples::Flags& flags, std::int64_t batch,
                        const std::shared_ptr<ddp::ProcessGroup>& process_group, const ddp::PrecisionPolicy& policy,
                        const ddp::DistributedDataParallelOptions& options) {
  const auto device = process_group->device();
  llama::LlamaConfig config;
  try {
    config = llama::LlamaConfig::preset(flags.str("preset"));
  } catch (const std::invalid_argument& e) {
    flags.fail(e.what());
  }
  if (flags.given("seq")) config.max_seq_len = flags.integer("seq");
  const bool unfused = flags.on("unfused");
  const std::set<std::string> unfuse =
      fusions_to_leave_out(flags, {"loss", "residual-norm", "fp32-weight-gradients", "qkv"}, "LLaMA");
  if (unfused) llama::use_reference_ops(config);
  if (flags.on("repeat-kv-heads")) config.repeat_kv_heads = true;
  if (unfuse.count("residual-norm") != 0) config.fused_residual_norm = false;
  if (unfuse.count("fp32-weight-gradients") != 0) config.fp32_weight_gradients = false;
  if (unfuse.count("qkv") != 0) config.fused_qkv = false;
  const bool fused_loss = config.fused_kernels && unfuse.count("loss") == 0;
  const std::int64_t seq = config.max_seq_len;
  llama::Llama model(config);
  model->to(device);
  ddp::Float8Scaling float8_scaling{};
  try {
    float8_scaling = llama::float8_scaling_named(flags.str("fp8-scaling"));
  } catch (const std::invalid_argument& e) {
    flags.fail(e.what());
  }
  std::string fp8_scaling = "null", fp8_fast_accum = "null";
  if (policy.uses_float8()) {
    llama::enable_float8_training(*model, float8_scaling, flags.on("fp8-fast-accum"));
    fp8_scaling = "\"" + flags.str("fp8-scaling") + "\"";
    fp8_fast_accum = flags.on("fp8-fast-accum") ? "true" : "false";
  }
  auto ddp_model = std::make_shared<ddp::DistributedDataParallel<llama::Llama>>(model, process_group, options);
  std::shared_ptr<torch::optim::Optimizer> optimizer = llama::make_adamw(*ddp_model, 3e-4, 0.95, 0.1);
  const at::Tensor tokens =
      torch::randint(0, config.vocab_size, {batch, seq + 1}, torch::TensorOptions().device(device).dtype(torch::kLong));
  const at::Tensor inputs = tokens.narrow(1, 0, seq), targets = tokens.narrow(1, 1, seq);

  Workload workload;
  workload.step = ddp_step(ddp_model, optimizer, [=] {
    ddp::PrecisionGuard guard(policy, device);
    return llama::next_token_loss((*ddp_model)(inputs), targets, fused_loss);
  });
  if (policy.uses_float8() && float8_scaling == ddp::Float8Scaling::kDelayed) {
    // As train_llama: the ranks agree on their FP8 scales before each optimizer step.
    workload.step.optimizer_step = [module = model.ptr(), process_group, step = workload.step.optimizer_step] {
      ddp::float8::all_reduce_amaxes(*module, *process_group);
      step();
    };
  }
  workload.unit = "tok/s";
  workload.items_per_rank = static_cast<double>(batch * seq);
  workload.params = config.parameter_count();
  // Matmul FLOPs of forward and backward per token: 6 per weight but the
  // embedding lookup's, plus causal attention's QK^T and AV, half masked.
  workload.flops_per_item = 6.0 * static_cast<double>(workload.params - config.vocab_size * config.dim) +
                            6.0 * static_cast<double>(config.n_layers * seq * config.dim);
  const bool fused_kernels_ran = config.fused_kernels && llama::ops::fused_kernels_built() && device.is_cuda();
  workload.json_fields = fmt::format(
      "\"model\": \"llama\", \"preset\": \"{}\", \"seq\": {}, \"image_size\": null, \"fp8_scaling\": {}, "
      "\"fp8_fast_accum\": {}, \"fused_kernels\": {}, \"repeat_kv_heads\": {}, \"unfuse\": \"{}\"",
      flags.str("preset"), seq, fp8_scaling, fp8_fast_accum, fused_kernels_ran, config.repeat_kv_heads,
      fmt::join(unfuse, ","));
  return workload;
}

}  // namespace

int main(int argc, char** argv) try {
  examples::Flags flags("scaling_bench", "Measures the training throughput of a bundled model under libddp.");
  flags.add("model", "resnet50", "resnet50 | llama")
      .add("preset", "tinyllama-1.1b", "LLaMA preset: tiny | tinyllama-1.1b | llama2-7b")
      .add("seq", "", "LLaMA tokens per sequence (default: the preset's)")
      .add("image-size", "224", "ResNet-50 image height and width")
      .add("precision", "bf16", "fp32 | tf32 | bf16 | fp8 (LLaMA)")
      .add("fp8-scaling", "delayed", "LLaMA fp8 recipe: delayed | current")
      .add_switch("fp8-fast-accum",
                  "LLaMA fp8: cuBLAS fast accumulation in the forward matmuls, as Transformer Engine's "
                  "and torchao's recipes do (off: every product accumulated in fp32)")
      .add("batch", "", "samples per rank (default: 128 images, 4 sequences)")
      .add("steps", "30", "timed steps")
      .add("warmup", "10", "untimed steps first (cuDNN autotuning, bucket rebuild, allocator warm-up)")
      .add("device", "auto", "auto (the GPUs when there are, else the CPU) | cuda | cpu")
      .add("bucket-cap-mb", "25", "DDP bucket size")
      .add("sharding", "none",
           "none | optimizer (ZeRO-1) | gradients (ZeRO-2) | full (ZeRO-3, LLaMA: a unit per block)")
      .add("param-dtype", "fp32", "a sharded mode: fp32 | bf16, the dtype blocks are gathered and computed in")
      .add_switch("no-unit-gathers",
                  "--sharding optimizer|gradients: no shard units, so the forward waits for every "
                  "parameter gather before it starts (the A/B of their overlap with the forward)")
      .add("reduce-dtype", "fp32",
           "dtype the gradients are all-reduced in: fp32 | bf16 (comm_hooks::average_in, as PyTorch's "
           "bf16_compress_hook; only where there is more than one process)")
      .add_switch("unfused",
                  "the ATen ops PyTorch's reference runs, not fused kernels: LLaMA's RMSNorm, RoPE, SwiGLU, loss and "
                  "repeated key/value heads, torch::nn::Linear's weight gradients, "
                  "ResNet-50's BatchNorm, residual add and ReLU (ddp::fused_batch_norm) and max pooling")
      .add("unfuse", "",
           "fusions to leave out, comma-separated, for the A/B of each; LLaMA: loss (ops::cross_entropy), "
           "residual-norm (the residual add in the norm's kernel), fp32-weight-gradients "
           "(ddp::Float8Options::fp32_weight_gradients), qkv (wq, wk, wv as three layers); ResNet-50: max-pool "
           "(torch::max_pool2d, not resnet::max_pool2d's kernels), shortcut-gradient (a block's input gradient "
           "summed by autograd's add, not in conv1's GEMM: resnet::conv1x1_and_shortcut); --unfused leaves out "
           "every fusion")
      .add_switch("repeat-kv-heads",
                  "LLaMA: grouped-query attention by repeating the key/value heads (as PyTorch's reference model), "
                  "not by SDPA's grouped heads (the A/B of that alone; --unfused implies it)")
      .add("bn", "auto", std::string("ResNet-50: ") + resnet::kBatchNormPathHelp + "; --unfused means aten")
      .add_switch("sync-bn",
                  "ResNet-50: BatchNorm statistics over every rank's batch (ddp::SyncBatchNorm, fused on CUDA)")
      .add_switch("copy-engine-reductions",
                  "move the gradient buckets between the GPUs with the copy engines, not NCCL's kernels "
                  "(ddp::InitOptions::copy_engine_reductions; one node)")
      .add_switch("no-timeline", "do not record the DDP timeline (exposed communication is then not reported)")
      .add_switch("cuda-graph",
                  "record the step into a CUDA graph after the warm-up and replay it (ddp::CapturedStep); "
                  "forward, backward and optimizer are then timed as one")
      .add("json", "", "append the result to this file, one JSON object per line (rank 0)")
      .add("profile-trace", "",
           "after the timed steps, profile one more (a replay of the graph with --cuda-graph) and write its Chrome "
           "trace here (rank 0)");
  flags.parse(argc, argv);
  const std::string model_name = flags.str("model");
  if (model_name != "resnet50" && model_name != "llama") flags.fail("--model must be resnet50 or llama");
  if (model_name != "resnet50" && flags.on("sync-bn")) flags.fail("--sync-bn is ResNet-50's: LLaMA has no BatchNorm");
  const auto policy = ddp::PrecisionPolicy::parse(flags.str("precision"));
  if (policy.needs_grad_scaler()) flags.fail("fp16 is not benchmarked (it needs the gradient scaler); use bf16");
  const std::int64_t steps = flags.integer("steps"), warmup = flags.integer("warmup");
  if (steps < 1 || warmup < 1) flags.fail("--steps and --warmup must be at least 1");

  const std::string device_name = flags.str("device");
  ddp::InitOptions init_options;
  if (device_name == "cpu") init_options.backend(ddp::Backend::kGloo);
  else if (device_name == "cuda") init_options.backend(ddp::Backend::kNccl);
  else if (device_name != "auto") flags.fail("--device must be auto, cuda or cpu");
  if (flags.on("copy-engine-reductions")) init_options.copy_engine_reductions(true);
  auto process_group = ddp::init(init_options);
  const auto device = process_group->device();
  policy.check_supported(device);
  // For the whole step: PyTorch's benchmark sets the TF32 switches globally too.
  ddp::set_process_tf32(policy);
  at::globalContext().setBenchmarkCuDNN(true);
  torch::manual_seed(0);

  const bool cuda_graph = flags.on("cuda-graph");
  if (cuda_graph && !device.is_cuda()) flags.fail("--cuda-graph needs a CUDA device");
  if (cuda_graph && warmup < 2)
    flags.fail("--cuda-graph needs --warmup 2 or more (the last warm-up step is recorded)");
  // The timeline's timing events are read on the host after each backward, which a replay has none of.
  const bool timeline = !flags.on("no-timeline") && device.is_cuda() && !cuda_graph;
  ddp::DistributedDataParallelOptions options;
  try {
    options = llama::sharding_options(flags.str("sharding"), flags.str("param-dtype"), policy);
  } catch (const std::invalid_argument& e) {
    flags.fail(e.what());
  }
  const ddp::Sharding sharding = options.sharding();
  if (sharding == ddp::Sharding::kFull && model_name != "llama") {
    flags.fail("--sharding full needs a model whose forward runs its units through ddp::in_unit; use --model llama");
  }
  if (options.param_dtype() && (model_name != "llama" || flags.on("no-unit-gathers"))) {
    flags.fail("--param-dtype bf16 applies to LLaMA's blocks as units: use --model llama without --no-unit-gathers");
  }
  if (model_name != "llama") options.shard_units({});  // ResNet's blocks do not run through ddp::in_unit
  if (flags.on("no-unit-gathers")) {
    if (sharding != ddp::Sharding::kOptimizer && sharding != ddp::Sharding::kGradients) {
      flags.fail("--no-unit-gathers applies to --sharding optimizer or gradients");
    }
    options.shard_units({});
  }
  options.bucket_cap_mb(flags.real("bucket-cap-mb")).record_timeline(timeline);
  const std::string reduce_dtype = flags.str("reduce-dtype");
  if (reduce_dtype != "fp32" && reduce_dtype != "bf16") flags.fail("--reduce-dtype must be fp32 or bf16");
  // One process reduces nothing, so its row stays the baseline of the scaling efficiency.
  if (reduce_dtype == "bf16" && process_group->world_size() > 1) {
    options.comm_hook(ddp::comm_hooks::average_in(at::kBFloat16));
  }
  const std::int64_t batch = flags.given("batch") ? flags.integer("batch") : model_name == "resnet50" ? 128 : 4;
  if (batch < 1) flags.fail("--batch must be at least 1");
  const Workload workload = model_name == "resnet50" ? resnet50_workload(flags, batch, process_group, policy, options)
                                                     : llama_workload(flags, batch, process_group, policy, options);
  const Step& step = workload.step;
  const auto eager_step = [&] {
    at::Tensor step_loss = step.forward_loss();
    step_loss.backward();
    step.optimizer_step();
    return step_loss;
  };
  std::unique_ptr<ddp::CapturedStep> captured;
  if (cuda_graph && !flags.str("profile-trace").empty() && process_group->rank() == 0) {
    write_profile_trace([] {}, device, "");
  }
  if (cuda_graph) {
    // The workload's data is fixed, so the recorded step takes no inputs.
    captured = std::make_unique<ddp::CapturedStep>(
        *step.optimizer, [&](const std::vector<at::Tensor>&) { return eager_step(); },
        ddp::CapturedStepOptions().warmup_steps(static_cast<int>(warmup - 1)).process_group(process_group));
  }

  // A captured run's last warm-up step records the graph (and replays it),
  // so both kinds train the same number of steps; the warm-up lasts longer
  // only where the step cannot be recorded yet (a GradScaler's skipped steps).
  at::Tensor loss;
  std::int64_t warmed = 0;
  for (; warmed < warmup || (captured && !captured->captured()); ++warmed) {
    loss = captured ? (*captured)({}) : eager_step();
  }
  const std::size_t timed_from = step.exposed_communication_ms().size();
  StepClock clock(device, static_cast<std::size_t>(steps) * 4);
  synchronize(*process_group);
  const auto start = std::chrono::steady_clock::now();
  for (std::int64_t i = 0; i < steps; ++i) {
    clock.mark();
    if (captured) {
      loss = (*captured)({});  // the whole step counts as forward
      clock.mark();
      clock.mark();
    } else {
      loss = step.forward_loss();
      clock.mark();
      loss.backward();
      clock.mark();
      step.optimizer_step();
    }
    clock.mark();
  }
  synchronize(*process_group);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::vector<double> forward, backward, optimizer;
  for (std::int64_t i = 0; i < steps; ++i) {
    forward.push_back(clock.interval_ms(4 * i));
    backward.push_back(clock.interval_ms(4 * i + 1));
    optimizer.push_back(clock.interval_ms(4 * i + 2));
  }
  std::vector<double> exposed = step.exposed_communication_ms();
  exposed.erase(exposed.begin(), exposed.begin() + static_cast<std::ptrdiff_t>(std::min(timed_from, exposed.size())));
  // The last timed step's; read now, as a replay below writes the graph's loss tensor again.
  const double final_loss = loss.item<double>();
  if (!flags.str("profile-trace").empty()) {
    // Every rank runs the step (DDP's collectives need all of them); rank 0 records it.
    const auto profiled_step = [&] {
      if (captured) {
        (*captured)({});  // a replay: the graph's kernels, and no host-side operators
      } else {
        const at::Tensor profiled_loss = step.forward_loss();
        profiled_loss.backward();
        step.optimizer_step();
      }
      synchronize(*process_group);
    };
    if (process_group->rank() == 0) {
      write_profile_trace(profiled_step, device, flags.str("profile-trace"));
    } else {
      profiled_step();
    }
  }
  const double peak_gib =
      max_over_ranks(*process_group, static_cast<double>(examples::peak_memory_bytes(device))) / (1 << 30);

  const int gpus = process_group->world_size();
  const double throughput = workload.items_per_rank * gpus * static_cast<double>(steps) / seconds;
  const std::string flops = workload.flops_per_item > 0
                                ? fmt::format("\"flops_per_item\": {:.6g}, \"tflops_per_gpu\": {:.2f}", workload.flops_per_item,
                                              throughput * workload.flops_per_item / gpus / 1e12)
                                : "\"flops_per_item\": null, \"tflops_per_gpu\": null";
  const std::string row = fmt::format(
      "{{\"impl\": \"{}\", {}, \"precision\": \"{}\", \"gpus\": {}, \"device\": \"{}\", \"batch_per_gpu\": {}, "
      "\"steps\": {}, \"warmup\": {}, \"step_ms\": {:.3f}, \"throughput\": {:.1f}, \"unit\": \"{}\", "
      "\"forward_ms\": {:.3f}, \"backward_ms\": {:.3f}, \"optimizer_ms\": {:.3f}, \"exposed_comm_ms\": {}, "
      "\"peak_mem_gib\": {:.3f}, \"params\": {}, {}, \"final_loss\": {:.5f}, \"bucket_cap_mb\": {}, "
      "\"reduce_dtype\": \"{}\", \"sharding\": \"{}\", \"param_dtype\": \"{}\", \"unit_gathers\": {}, \"nccl_env\": "
      "{}, \"copy_engine_reductions\": {}, \"cuda_graph\": {}, \"torch_version\": \"{}\"}}",
      std::string(cuda_graph ? "libddp-graph" : "libddp") + (flags.on("unfused") ? "-unfused" : ""),
      workload.json_fields, ddp::to_string(policy.precision()), gpus, device.str(), batch, steps, warmed,
      1000 * seconds / static_cast<double>(steps), throughput, workload.unit, mean(forward), mean(backward),
      mean(optimizer), timeline ? fmt::format("{:.4f}", median(exposed)) : "null", peak_gib, workload.params, flops,
      final_loss, flags.real("bucket-cap-mb"), reduce_dtype, ddp::to_string(sharding), flags.str("param-dtype"),
      !options.shard_units().empty(), nccl_environment_json(), flags.on("copy-engine-reductions"), cuda_graph,
      TORCH_VERSION);
  if (process_group->rank() == 0) {
    std::printf("%s\n", row.c_str());
    if (!flags.str("json").empty()) {
      std::ofstream out(flags.str("json"), std::ios::app);
      out << row << '\n';
      if (!out) throw std::runtime_error("could not write " + flags.str("json"));
    }
  }
  synchronize(*process_group);
  return 0;
} catch (const ddp::UsageError& e) {
  std::fprintf(stderr, "scaling_bench: error: %s\n", e.what());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "scaling_bench: error: %s\n", e.what());
  return 1;
}
