// ddp::fused_batch_norm against ATen's BatchNorm (cuDNN), add and ReLU on the
// BatchNorm shapes of ResNet-50 at one batch, forward and backward, next to
// the device's copy bandwidth measured in the same run: the kernels are
// memory-bound, so bytes moved / time against a copy's is their efficiency.
// Times are GPU times: each variant's calls are recorded into a CUDA graph
// and replayed (bench::best_graph_ms_per_call), so that autograd's host work
// and the launches, which a captured training step does not pay, do not hide
// the small shapes' kernels.
// Three paths of ddp::fused_batch_norm: ATen's separate ops, libddp's own
// kernels and cuDNN's fused NHWC kernels (with cuDNN's values checked against
// libddp's).
//
//   fused_bn_bench [--batch 128] [--dtype bf16] [--iterations 50] [--trials 5]

#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "common/device_timing.h"
#include "common/run_info.h"
#include "flags.h"

namespace {

struct Shape {
  std::string where;
  int64_t channels, side;
  bool residual;  // the bottleneck's last BatchNorm: + identity, then ReLU
  int count;      // how many of ResNet-50's BatchNorms have this shape and kind
  bool relu = true;  // false: the downsample's BatchNorm, whose output is the identity
};

// ResNet-50 (torchvision v1.5) at 224 x 224: every BatchNorm, grouped.
const std::vector<Shape> kShapes{
    {"stem", 64, 112, false, 1},      {"layer1 bn1/bn2", 64, 56, false, 6}, {"layer1 bn3", 256, 56, true, 3},
    {"layer1 downsample", 256, 56, false, 1, false}, {"layer2 bn1", 128, 56, false, 1}, {"layer2 bn1/bn2", 128, 28, false, 7},
    {"layer2 bn3", 512, 28, true, 4}, {"layer2 downsample", 512, 28, false, 1, false}, {"layer3 bn1", 256, 28, false, 1},
    {"layer3 bn1/bn2", 256, 14, false, 11}, {"layer3 bn3", 1024, 14, true, 6}, {"layer3 downsample", 1024, 14, false, 1, false},
    {"layer4 bn1", 512, 14, false, 1}, {"layer4 bn1/bn2", 512, 7, false, 5}, {"layer4 bn3", 2048, 7, true, 3},
    {"layer4 downsample", 2048, 7, false, 1, false}};

}  // namespace

int main(int argc, char** argv) try {
  examples::Flags flags("fused_bn_bench", "ddp::fused_batch_norm against ATen on ResNet-50's BatchNorm shapes.");
  flags.add("batch", "128", "images")
      .add("dtype", "bf16", "bf16 | fp16 | fp32")
      .add("iterations", "50", "calls per trial");
  flags.add("trials", "5", "trials (the best is kept)");
  flags.parse(argc, argv);
  const int64_t batch = flags.integer("batch");
  const std::string dtype_name = flags.str("dtype");
  if (dtype_name != "bf16" && dtype_name != "fp16" && dtype_name != "fp32") flags.fail("--dtype: bf16, fp16 or fp32");
  const auto dtype = dtype_name == "fp32" ? torch::kFloat : (dtype_name == "fp16" ? torch::kHalf : torch::kBFloat16);
  const int iterations = static_cast<int>(flags.integer("iterations"));
  const int trials = static_cast<int>(flags.integer("trials"));
  if (!torch::cuda::is_available()) flags.fail("needs a CUDA device");
  const auto info = bench::run_info(0);
  std::printf("%s, %s, commit %s; batch %lld, %s, channels_last\n", info.gpu.c_str(), info.date.c_str(),
              info.commit.c_str(), static_cast<long long>(batch), flags.str("dtype").c_str());

  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  // The copy bandwidth: a 1 GiB device-to-device copy (read + write).
  const torch::Tensor from = torch::empty({1 << 28}, cuda.dtype(torch::kFloat));
  const torch::Tensor to = torch::empty_like(from);
  const double copy_ms = bench::best_graph_ms_per_call(iterations, trials, [&] { to.copy_(from); });
  const double copy_gbps = 2.0 * from.nbytes() / copy_ms / 1e6;
  std::printf("copy: %.0f GB/s\n\n", copy_gbps);

  std::printf(
      "| BatchNorm | C x H x W | n | ATen (ms) | libddp's kernels (ms) | cuDNN's (ms) | libddp speed-up | cuDNN "
      "speed-up | libddp's of copy | cuDNN vs libddp: largest difference of y, dx (relative) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  // ddp::fused_batch_norm's paths: ATen's ops, libddp's kernels, cuDNN's.
  constexpr ddp::FusedBatchNormPath kPaths[3] = {ddp::FusedBatchNormPath::kAten, ddp::FusedBatchNormPath::kLibddp,
                                                 ddp::FusedBatchNormPath::kCudnn};
  double totals[3] = {0, 0, 0};
  for (const Shape& s : kShapes) {
    const auto shape = std::vector<int64_t>{batch, s.channels, s.side, s.side};
    const auto nhwc = [&] { return torch::randn(shape, cuda.dtype(dtype)).contiguous(torch::MemoryFormat::ChannelsLast); };
    torch::Tensor x = nhwc().requires_grad_(true);
    torch::Tensor residual = s.residual ? nhwc().requires_grad_(true) : torch::Tensor();
    const torch::Tensor grad = nhwc();
    const torch::Tensor weight = torch::ones({s.channels}, cuda).requires_grad_(true);
    const torch::Tensor bias = torch::zeros({s.channels}, cuda).requires_grad_(true);
    const torch::Tensor running_mean = torch::zeros({s.channels}, cuda);
    const torch::Tensor running_var = torch::ones({s.channels}, cuda);
    // Gradients are dropped after each call, so none is accumulated into.
    const auto call = [&](ddp::FusedBatchNormPath path) {
      x.mutable_grad() = torch::Tensor();
      if (s.residual) residual.mutable_grad() = torch::Tensor();
      ddp::fused_batch_norm(x, weight, bias, running_mean, running_var, residual,
                            ddp::FusedBatchNormOptions().relu(s.relu).path(path))
          .backward(grad);
    };
    double ms[3];
    for (int p = 0; p < 3; ++p) {
      ms[p] = bench::best_graph_ms_per_call(iterations, trials, [&] { call(kPaths[p]); });
      totals[p] += ms[p] * s.count;
    }
    // libddp's passes: forward reads x twice (+ residual), writes y; backward
    // reads dy, y and x twice each, writes dx (+ the residual's gradient).
    const double elements = static_cast<double>(x.numel()) * x.element_size();
    // (Without ReLU neither backward pass reads y.)
    const double bytes = elements * ((s.residual ? 4 : 3) + (s.residual ? 8 : 7) - (s.relu ? 0 : 2));
    const double gbps = bytes / ms[1] / 1e6;
    // cuDNN's values against libddp's kernels'.
    const auto outputs = [&](ddp::FusedBatchNormPath path) {
      x.mutable_grad() = torch::Tensor();
      const torch::Tensor y = ddp::fused_batch_norm(x, weight, bias, running_mean.clone(), running_var.clone(),
                                                    residual, ddp::FusedBatchNormOptions().relu(s.relu).path(path));
      y.backward(grad);
      return std::make_pair(y.detach().to(torch::kFloat), x.grad().to(torch::kFloat));
    };
    const auto [y_libddp, dx_libddp] = outputs(ddp::FusedBatchNormPath::kLibddp);
    const auto [y_cudnn, dx_cudnn] = outputs(ddp::FusedBatchNormPath::kCudnn);
    const auto relative = [](const torch::Tensor& a, const torch::Tensor& reference) {
      return ((a - reference).abs().max() / reference.abs().max().clamp_min(1e-30)).item<double>();
    };
    std::printf("| %s%s | %lld x %lld x %lld | %d | %.3f | %.3f | %.3f | %.2fx | %.2fx | %.0f%% | %.2g, %.2g |\n",
                s.where.c_str(), s.residual ? " (+add, relu)" : (s.relu ? " (relu)" : ""),
                static_cast<long long>(s.channels), static_cast<long long>(s.side), static_cast<long long>(s.side),
                s.count, ms[0], ms[1], ms[2], ms[0] / ms[1], ms[0] / ms[2], 100 * gbps / copy_gbps,
                relative(y_cudnn, y_libddp), relative(dx_cudnn, dx_libddp));
  }
  std::printf(
      "\nall %d BatchNorms of a step (each shape x n): ATen %.2f ms, libddp's kernels %.2f ms (%.2fx), cuDNN's "
      "%.2f ms (%.2fx)\n",
      53, totals[0], totals[1], totals[0] / totals[1], totals[2], totals[0] / totals[2]);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fused_bn_bench: error: %s\n", e.what());
  return 1;
}
