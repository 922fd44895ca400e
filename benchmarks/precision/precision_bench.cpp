// Matmul throughput per precision policy at 8192^3, Float8Linear against a
// bf16 Linear at LLaMA-1.1B shapes, and the bandwidth of the FP8 cast kernel
// at those shapes against a device copy moving the same bytes, on one GPU,
// measured in the same run.
//
//   build/benchmarks/precision/precision_bench --json results.json --markdown results.md
//
// Each case is timed over a batch of iterations between two device
// synchronisations, after warm-up; the best of several trials is kept, so
// clock ramp-up and stray work do not count against one side.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <ddp/ddp.h>

#include "common/device_timing.h"
#include "common/run_info.h"
#include "flags.h"

namespace {

struct Args {
  std::int64_t size = 8192;
  std::int64_t tokens = 8192;
  int iterations = 20;
  int trials = 5;
  std::string json;
  std::string markdown;
};

Args parse_args(int argc, char** argv) {
  examples::Flags flags("precision_bench",
                        "Matmul throughput per precision policy, Float8Linear against bf16 Linear, and the FP8 cast "
                        "kernel's bandwidth, on one GPU.");
  flags.add("size", "8192", "side of the square matmuls")
      .add("tokens", "8192", "tokens of the Float8Linear and cast measurements")
      .add("iterations", "20", "calls per trial")
      .add("trials", "5", "trials; the best is reported")
      .add("json", "", "write the results to this file")
      .add("markdown", "", "write the table to this file");
  flags.parse(argc, argv);
  Args args;
  args.size = flags.integer("size");
  args.tokens = flags.integer("tokens");
  args.iterations = static_cast<int>(flags.integer("iterations"));
  args.trials = static_cast<int>(flags.integer("trials"));
  args.json = flags.str("json");
  args.markdown = flags.str("markdown");
  if (args.size < 16 || args.tokens < 16 || args.iterations < 1 || args.trials < 1) {
    flags.fail("--size and --tokens must be at least 16, --iterations and --trials at least 1");
  }
  return args;
}

double time_ms(const Args& args, const std::function<void()>& body) {
  return bench::best_ms_per_call(args.iterations, args.trials, body);
}

struct Row {
  std::string name;
  std::string detail;
  double ms;
  double tflops;
  double ratio;  // against the row's baseline
  std::string baseline;
  double terabytes_per_s = 0;  // memory traffic, for the casts
};

}  // namespace

int main(int argc, char** argv) try {
  const Args args = parse_args(argc, argv);
  const torch::Device gpu(torch::kCUDA, 0);
  const auto f32 = torch::TensorOptions().device(gpu).dtype(torch::kFloat);
  std::vector<Row> rows;

  // 1. Matmul throughput per policy, n^3.
  const std::int64_t n = args.size;
  const double matmul_flop = 2.0 * n * n * n;
  const auto a = torch::randn({n, n}, f32);
  const auto b = torch::randn({n, n}, f32);
  std::map<std::string, double> matmul_ms;
  for (const std::string name : {"fp32", "tf32", "bf16", "fp16"}) {
    const auto policy = ddp::PrecisionPolicy::parse(name);
    ddp::PrecisionGuard guard(policy, gpu);
    // Operands already in the policy's dtype: this measures the matmul, not the casts.
    const auto dtype = policy.autocast_dtype().value_or(torch::kFloat);
    const auto a_cast = a.to(dtype);
    const auto b_cast = b.to(dtype);
    matmul_ms[name] = time_ms(args, [&] { torch::matmul(a_cast, b_cast); });
  }
  const auto a8 = a.to(torch::kFloat8_e4m3fn);
  const auto b8 = b.t().contiguous().to(torch::kFloat8_e4m3fn).t();  // column-major, as cuBLASLt wants
  const auto one = torch::ones({}, f32);
  for (const bool fast : {false, true}) {
    matmul_ms[fast ? "fp8 (fast accumulation)" : "fp8"] = time_ms(args, [&] {
      at::_scaled_mm(a8, b8, one, one, c10::nullopt, c10::nullopt, torch::kBFloat16, fast);
    });
  }
  for (const auto& [name, ms] : matmul_ms) {
    const std::string baseline = name == "tf32" ? "fp32" : name.rfind("fp8", 0) == 0 ? "bf16" : "";
    rows.push_back({"matmul " + name, fmt::format("{0}x{0}x{0}", n), ms, matmul_flop / ms / 1e9,
                    baseline.empty() ? 0.0 : matmul_ms[baseline] / ms, baseline});
  }

  // 2. Float8Linear forward + backward against a bf16 (autocast) Linear.
  for (const auto [in, out] : {std::pair<std::int64_t, std::int64_t>{2048, 5632}, {5632, 2048}}) {
    const double flop = 3 * 2.0 * args.tokens * in * out;  // forward, grad input, grad weight
    const auto x = torch::randn({args.tokens, in}, f32.dtype(torch::kBFloat16)).requires_grad_();
    const auto grad = torch::randn({args.tokens, out}, f32.dtype(torch::kBFloat16));
    std::map<std::string, double> ms;
    const auto bf16 = ddp::PrecisionPolicy::parse("bf16");
    const auto fp8 = ddp::PrecisionPolicy::parse("fp8");
    for (const std::string variant : {"bf16 Linear", "Float8Linear current", "Float8Linear delayed"}) {
      const bool float8 = variant != "bf16 Linear";
      auto options = ddp::Float8Options().enabled(float8).scaling(
          variant == "Float8Linear delayed" ? ddp::Float8Scaling::kDelayed : ddp::Float8Scaling::kCurrent);
      ddp::Float8Linear layer(torch::nn::LinearOptions(in, out).bias(false), options);
      layer->to(gpu);
      const auto& policy = float8 ? fp8 : bf16;
      ms[variant] = time_ms(args, [&] {
        torch::Tensor y;
        {
          ddp::PrecisionGuard guard(policy, gpu);
          y = layer(x);
        }
        y.backward(grad);
      });
    }
    for (const auto& [variant, value] : ms) {
      const bool float8 = variant != "bf16 Linear";
      rows.push_back({variant + " fwd+bwd", fmt::format("{}->{}, {} tokens", in, out, args.tokens), value,
                      flop / value / 1e9, float8 ? ms["bf16 Linear"] / value : 0.0, float8 ? "bf16 Linear" : ""});
    }
  }

  // 3. The FP8 cast as Float8Linear runs it (delayed scaling: scale given,
  // amax taken, transpose written): activations and output gradients in
  // bf16, weights in fp32. Traffic: the input read, two FP8 copies written.
  for (const auto& [dtype, rows_count, cols] :
       {std::tuple{torch::kBFloat16, args.tokens, std::int64_t{2048}}, std::tuple{torch::kBFloat16, args.tokens,
                                                                                 std::int64_t{5632}},
        std::tuple{torch::kFloat, std::int64_t{5632}, std::int64_t{2048}}}) {
    const auto input = torch::randn({rows_count, cols}, f32).to(dtype);
    ddp::Float8Tensor cast;
    cast.data = torch::empty({rows_count, cols}, f32.dtype(torch::kFloat8_e4m3fn));
    cast.transposed = torch::empty({cols, rows_count}, f32.dtype(torch::kFloat8_e4m3fn));
    cast.amax = torch::zeros({}, f32);
    cast.scale = torch::full({}, 2.0f, f32);
    cast.inverse_scale = torch::empty({}, f32);
    const double ms = time_ms(args, [&] { ddp::float8::cast_transpose(input, cast); });
    const double bytes = static_cast<double>(input.numel()) * (input.element_size() + 2);
    // The yardstick: a device copy moving the same bytes (half read, half
    // written), timed the same way, in the same process and minute.
    const auto source = torch::empty({static_cast<std::int64_t>(bytes / 2)}, f32.dtype(torch::kByte));
    auto destination = torch::empty_like(source);
    const double copy_ms = time_ms(args, [&] { destination.copy_(source); });
    const double copy_tbps = bytes / copy_ms / 1e9;
    rows.push_back({"device copy", fmt::format("{:.1f} MB read and written", bytes / 1e6), copy_ms, 0.0, 0.0, "",
                    copy_tbps});
    const double cast_tbps = bytes / ms / 1e9;
    rows.push_back({fmt::format("FP8 cast, {} -> e4m3 + transpose + amax", c10::toString(dtype)),
                    fmt::format("{} x {}", rows_count, cols), ms, 0.0, cast_tbps / copy_tbps,
                    "device copy (fraction of its bandwidth)", cast_tbps});
  }

  const auto info = bench::run_info(0);
  std::string table =
      "| case | shape | ms | TFLOP/s | TB/s | speed-up | against |\n|---|---|---|---|---|---|---|\n";
  for (const auto& row : rows) {
    table += fmt::format("| {} | {} | {:.3f} | {} | {} | {} | {} |\n", row.name, row.detail, row.ms,
                         row.tflops > 0 ? fmt::format("{:.0f}", row.tflops) : "",
                         row.terabytes_per_s > 0 ? fmt::format("{:.2f}", row.terabytes_per_s) : "",
                         row.ratio > 0 ? fmt::format("{:.2f}x", row.ratio) : "", row.baseline);
  }
  std::printf("%s\n%s", fmt::format("{}, {}, commit {}, LibTorch {}", info.gpu, info.date, info.commit,
                                    TORCH_VERSION).c_str(), table.c_str());
  if (!args.markdown.empty()) {
    std::ofstream(args.markdown) << "# Precision benchmark\n\n"
                                 << fmt::format("{}, {}, commit {}, LibTorch {}; best of {} trials of {} "
                                                "iterations.\n\n",
                                                info.gpu, info.date, info.commit, TORCH_VERSION, args.trials,
                                                args.iterations)
                                 << table;
  }
  if (!args.json.empty()) {
    std::string json = fmt::format("{{\"gpu\": \"{}\", \"date\": \"{}\", \"commit\": \"{}\", \"libtorch\": \"{}\", "
                                   "\"rows\": [",
                                   info.gpu, info.date, info.commit, TORCH_VERSION);
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& row = rows[i];
      json += fmt::format("{}{{\"case\": \"{}\", \"shape\": \"{}\", \"ms\": {:.4f}, \"tflops\": {:.1f}, "
                          "\"tbps\": {:.3f}, \"speedup\": {:.3f}, \"against\": \"{}\"}}",
                          i ? ", " : "", row.name, row.detail, row.ms, row.tflops, row.terabytes_per_s, row.ratio,
                          row.baseline);
    }
    std::ofstream(args.json) << json << "]}\n";
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "precision_bench: %s\n", e.what());
  return 1;
}
