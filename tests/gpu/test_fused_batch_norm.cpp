// ddp::fused_batch_norm's CUDA paths, libddp's kernels and cuDNN's, against
// ATen's BatchNorm, add and ReLU: outputs, running statistics and the
// gradients of input, residual, weight and bias, in fp32 and bf16, for
// ResNet-like shapes; and synchronised over NCCL against one process.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "batchnorm/kernels.h"
#include "support/multiprocess.h"
#include "support/sync_batch_norm_scenarios.h"
#ifdef DDP_WITH_CUDNN
#include "batchnorm/cudnn_batch_norm.h"
#endif

namespace {

struct Case {
  std::vector<int64_t> shape;  // [N, C, H, W] (channels_last) or [N, C]
  bool residual;
  bool relu;
};

struct Result {
  torch::Tensor y, running_mean, running_var, grad_x, grad_residual, grad_weight, grad_bias;
};

/// Runs one training step of the layer on fp32 master copies of the inputs
/// cast to `dtype` on `path`; kAten: ATen's ops on the same values in fp32.
Result run(const Case& c, torch::ScalarType dtype, ddp::FusedBatchNormPath path) {
  const bool fused = path != ddp::FusedBatchNormPath::kAten;
  auto generator = at::detail::createCPUGenerator(42);
  const int64_t channels = c.shape[1];
  const auto format = c.shape.size() == 4 ? torch::MemoryFormat::ChannelsLast : torch::MemoryFormat::Contiguous;
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  // The inputs as the fused path sees them (rounded to dtype), then in the reference's dtype.
  const torch::Tensor x0 = (torch::randn(c.shape, generator) * 3 + 1).to(dtype).to(torch::kFloat);
  const torch::Tensor r0 = torch::randn(c.shape, generator).to(dtype).to(torch::kFloat);
  const torch::Tensor g0 = torch::randn(c.shape, generator).to(dtype).to(torch::kFloat);
  const torch::ScalarType compute = fused ? dtype : torch::kFloat;
  torch::Tensor x = x0.to(cuda.dtype(compute)).contiguous(format).requires_grad_(true);
  torch::Tensor residual = r0.to(cuda.dtype(compute)).contiguous(format).requires_grad_(true);
  torch::Tensor weight = (torch::rand({channels}, generator) + 0.5).to(cuda).requires_grad_(true);
  torch::Tensor bias = torch::randn({channels}, generator).to(cuda).requires_grad_(true);
  torch::Tensor running_mean = torch::zeros({channels}, cuda);
  torch::Tensor running_var = torch::ones({channels}, cuda);
  const auto options = ddp::FusedBatchNormOptions().relu(c.relu).momentum(0.2).path(path);
  torch::Tensor y = fused ? ddp::fused_batch_norm(x, weight, bias, running_mean, running_var,
                                                  c.residual ? residual : torch::Tensor(), options)
                          : torch::batch_norm(x, weight, bias, running_mean, running_var, true, 0.2, 1e-5, true);
  if (!fused) {
    if (c.residual) y = y + residual;
    if (c.relu) y = torch::relu(y);
  }
  y.backward(g0.to(cuda.dtype(compute)).contiguous(format));
  return {y.detach().to(torch::kFloat).cpu(),
          running_mean.cpu(),
          running_var.cpu(),
          x.grad().to(torch::kFloat).cpu(),
          c.residual ? residual.grad().to(torch::kFloat).cpu() : torch::Tensor(),
          weight.grad().cpu(),
          bias.grad().cpu()};
}

void expect_close(const torch::Tensor& got, const torch::Tensor& expected, double tolerance, const std::string& what) {
  ASSERT_EQ(got.sizes(), expected.sizes()) << what;
  const double scale = std::max(1.0, expected.abs().max().item<double>());
  const double error = (got - expected).abs().max().item<double>();
  EXPECT_LE(error, tolerance * scale) << what << ": largest difference " << error << " against a scale of " << scale;
}

/// Whether `path` takes case `c` itself (rather than falling back to ATen's
/// ops, which would make the comparison vacuous).
bool path_takes(ddp::FusedBatchNormPath path, const Case& c, torch::ScalarType dtype) {
  const auto format = c.shape.size() == 4 ? torch::MemoryFormat::ChannelsLast : torch::MemoryFormat::Contiguous;
  const torch::Tensor x =
      torch::empty(c.shape, torch::TensorOptions().device(torch::kCUDA).dtype(dtype)).contiguous(format);
  if (path == ddp::FusedBatchNormPath::kLibddp) return ddp::detail::fits_fused_batch_norm(x);
#ifdef DDP_WITH_CUDNN
  return ddp::detail::cudnn_runs_batch_norm(x, c.residual ? x : torch::Tensor(), c.relu, 1e-5);
#else
  return false;
#endif
}

void expect_matches_aten(ddp::FusedBatchNormPath path, torch::ScalarType dtype, double tolerance) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a GPU";
  const bool cudnn = path == ddp::FusedBatchNormPath::kCudnn;
  // cuDNN: [N, C, H, W] only, and a residual only before the ReLU.
  std::vector<Case> cases{{{8, 64, 14, 14}, true, true},
                          {{4, 256, 7, 7}, false, true},
                          {{2, 2048, 7, 7}, true, true},
                          {{16, 512, 28, 28}, false, false}};
  if (!cudnn) cases.insert(cases.end(), {{{3, 128, 5, 9}, true, false}, {{96, 12}, false, false}});
  for (const Case& c : cases) {
    const std::string name = "shape " + std::to_string(c.shape[0]) + "x" + std::to_string(c.shape[1]) +
                             (c.residual ? " +residual" : "") + (c.relu ? " +relu" : "");
    SCOPED_TRACE(name);
    ASSERT_TRUE(path_takes(path, c, dtype)) << name << ": the path falls back to ATen's ops";
    const Result fused = run(c, dtype, path);
    const Result reference = run(c, dtype, ddp::FusedBatchNormPath::kAten);
    expect_close(fused.y, reference.y, tolerance, name + ": output");
    expect_close(fused.running_mean, reference.running_mean, 1e-5, name + ": running mean");
    expect_close(fused.running_var, reference.running_var, 1e-5, name + ": running variance");
    expect_close(fused.grad_x, reference.grad_x, tolerance, name + ": input gradient");
    if (c.residual) expect_close(fused.grad_residual, reference.grad_residual, tolerance, name + ": residual gradient");
    expect_close(fused.grad_weight, reference.grad_weight, tolerance, name + ": weight gradient");
    expect_close(fused.grad_bias, reference.grad_bias, tolerance, name + ": bias gradient");
  }
}

TEST(FusedBatchNorm, Fp32MatchesAten) { expect_matches_aten(ddp::FusedBatchNormPath::kLibddp, torch::kFloat, 1e-4); }

// bf16 in and out, fp32 inside: within bf16's rounding of the fp32 reference.
TEST(FusedBatchNorm, Bf16MatchesAtenInFp32) {
  expect_matches_aten(ddp::FusedBatchNormPath::kLibddp, torch::kBFloat16, 2e-2);
}

#ifdef DDP_WITH_CUDNN
TEST(FusedBatchNorm, CudnnFp32MatchesAten) {
  expect_matches_aten(ddp::FusedBatchNormPath::kCudnn, torch::kFloat, 1e-4);
}

TEST(FusedBatchNorm, CudnnBf16MatchesAtenInFp32) {
  expect_matches_aten(ddp::FusedBatchNormPath::kCudnn, torch::kBFloat16, 2e-2);
}

// kAuto takes cuDNN's kernels where cuDNN runs the shape: ResNet-50's BatchNorms in bf16.
TEST(FusedBatchNorm, AutoTakesCudnnForResNetShapes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a GPU";
  for (const Case& c : std::vector<Case>{
           {{128, 64, 112, 112}, false, true}, {{128, 256, 56, 56}, true, true}, {{128, 2048, 7, 7}, false, false}}) {
    EXPECT_TRUE(path_takes(ddp::FusedBatchNormPath::kCudnn, c, torch::kBFloat16)) << c.shape[1] << " channels";
  }
}
#endif

// Synchronised over two GPUs, libddp's kernels with an all-reduce between
// their passes equal one process's ATen ops on both ranks' batches: ranks of
// different sizes, and one with no images (it still joins every collective,
// although its empty input has NCHW strides), and NCHW inputs; the kernels'
// autograd function made every output.
TEST(FusedBatchNorm, SynchronisedOverNcclMatchesOneProcess) {
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  using namespace ddp::testing;
  expect_all_succeeded(run_ranks(2, [](int) {
    auto pg = ddp::init(ddp::InitOptions().backend(ddp::Backend::kNccl).timeout(std::chrono::seconds(60)));
    for (const torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16}) {
      const double tolerance = dtype == torch::kFloat ? 1e-4 : 2e-2;
      check_fused_sync_batch_norm_matches_one_process(pg, {5, 3}, dtype, tolerance, /*fused_kernels=*/true);
      check_fused_sync_batch_norm_matches_one_process(pg, {4, 0}, dtype, tolerance, /*fused_kernels=*/true);
    }
    // NCHW input: copied into channels_last for the kernels, the output copied back.
    check_fused_sync_batch_norm_matches_one_process(pg, {3, 2}, torch::kFloat, 1e-4, /*fused_kernels=*/true,
                                                    torch::MemoryFormat::Contiguous);
  }));
}

}  // namespace
