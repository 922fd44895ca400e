// ddp::fused_batch_norm against ATen's BatchNorm (cuDNN), add and ReLU on the
// BatchNorm shapes of ResNet-50 at one batch, forward and backward, next to
// the device's copy bandwidth measured in the same run: the kernels are
// memory-bound, so bytes moved / time against a copy's is their efficiency.
// Times are GPU times: each variant's calls are recorded into a CUDA graph
// and replayed (bench::best_graph_ms_per_call), so that autograd's host work
// and the launches, which a captured training step does not pay, do not hide
// the small shapes' kernels.
// Where cuDNN has its own fused BatchNorm + add + ReLU (the persistent NHWC
// kernels of cudnnBatchNormalizationForwardTrainingEx), that runs too, checked
// against the fused kernels' values.
//
//   fused_bn_bench [--batch 128] [--dtype bf16] [--iterations 50] [--trials 5]

#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "batchnorm/cudnn_bn_add_relu.h"
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
      "| BatchNorm | C x H x W | n | ATen fwd+bwd (ms) | fused fwd+bwd (ms) | speed-up | fused GB/s | of copy | "
      "cuDNN fused (ms) | cuDNN vs fused: largest difference of y, dx (relative) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  double aten_total = 0, fused_total = 0, cudnn_total = 0;
  bool cudnn_everywhere = true;
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
    const auto aten = [&] {
      x.mutable_grad() = torch::Tensor();
      if (s.residual) residual.mutable_grad() = torch::Tensor();
      torch::Tensor y = torch::batch_norm(x, weight, bias, running_mean, running_var, true, 0.1, 1e-5, true);
      if (s.residual) y = y + residual;
      (s.relu ? torch::relu(y) : y).backward(grad);
    };
    const auto fused = [&] {
      x.mutable_grad() = torch::Tensor();
      if (s.residual) residual.mutable_grad() = torch::Tensor();
      ddp::fused_batch_norm(x, weight, bias, running_mean, running_var, residual,
                            ddp::FusedBatchNormOptions().relu(s.relu))
          .backward(grad);
    };
    const double aten_ms = bench::best_graph_ms_per_call(iterations, trials, aten);
    const double fused_ms = bench::best_graph_ms_per_call(iterations, trials, fused);
    // The fused passes: forward reads x twice (+ residual), writes y; backward
    // reads dy, y and x twice each, writes dx (+ the residual's gradient).
    const double elements = static_cast<double>(x.numel()) * x.element_size();
    // (Without ReLU neither backward pass reads y.)
    const double bytes = elements * ((s.residual ? 4 : 3) + (s.residual ? 8 : 7) - (s.relu ? 0 : 2));
    const double gbps = bytes / fused_ms / 1e6;
    aten_total += aten_ms * s.count;
    fused_total += fused_ms * s.count;

    // cuDNN's fused path, on the same inputs; its values against the fused kernels'.
    std::string cudnn_ms_text, cudnn_diff_text;
    bench::CudnnBnAddRelu cudnn(x, s.residual, s.relu);
    if (!cudnn.unsupported().empty()) {
      cudnn_everywhere = false;
      cudnn_ms_text = "not run: " + cudnn.unsupported();
      cudnn_diff_text = "—";
    } else {
      const torch::Tensor w = weight.detach(), b = bias.detach(), z = s.residual ? residual.detach() : torch::Tensor();
      const torch::Tensor mean = running_mean.clone(), var = running_var.clone();
      const double cudnn_ms = bench::best_graph_ms_per_call(
          iterations, trials, [&] { cudnn.forward_backward(x.detach(), z, grad, w, b, mean, var); });
      cudnn_total += cudnn_ms * s.count;
      x.mutable_grad() = torch::Tensor();
      const torch::Tensor y = ddp::fused_batch_norm(x, weight, bias, running_mean.clone(), running_var.clone(),
                                                    residual, ddp::FusedBatchNormOptions().relu(s.relu));
      y.backward(grad);
      const auto relative = [](const torch::Tensor& a, const torch::Tensor& reference) {
        return ((a.to(torch::kFloat) - reference.to(torch::kFloat)).abs().max() /
                reference.to(torch::kFloat).abs().max().clamp_min(1e-30))
            .item<double>();
      };
      cudnn_ms_text = fmt::format("{:.3f}", cudnn_ms);
      cudnn_diff_text =
          fmt::format("{:.2g}, {:.2g}", relative(cudnn.output(), y.detach()), relative(cudnn.grad_input(), x.grad()));
    }
    std::printf("| %s%s | %lld x %lld x %lld | %d | %.3f | %.3f | %.2fx | %.0f | %.0f%% | %s | %s |\n", s.where.c_str(),
                s.residual ? " (+add, relu)" : (s.relu ? " (relu)" : ""), static_cast<long long>(s.channels),
                static_cast<long long>(s.side), static_cast<long long>(s.side), s.count, aten_ms, fused_ms,
                aten_ms / fused_ms, gbps, 100 * gbps / copy_gbps, cudnn_ms_text.c_str(), cudnn_diff_text.c_str());
  }
  std::printf("\nall %d BatchNorms of a step (each shape x n): ATen %.2f ms, fused %.2f ms, %.2fx", 53, aten_total,
              fused_total, aten_total / fused_total);
  if (cudnn_everywhere) {
    std::printf("; cuDNN's fused path %.2f ms (fused kernels / cuDNN: %.2fx)", cudnn_total, cudnn_total / fused_total);
  } else {
    std::printf("; cuDNN's fused path does not run every shape (see the table)");
  }
  std::printf("\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fused_bn_bench: error: %s\n", e.what());
  return 1;
}
