#include "max_pool.h"

#include <torch/autograd.h>

#if RESNET_WITH_CUDA_KERNELS
#include "max_pool_kernels.h"
#endif

namespace resnet {
namespace {

#if RESNET_WITH_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct FusedMaxPool : torch::autograd::Function<FusedMaxPool> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t kernel, int64_t stride,
                               int64_t padding) {
    auto [y, offsets] = kernels::max_pool_forward(x, {kernel, stride, padding});
    ctx->save_for_backward({offsets});
    ctx->saved_data["input_sizes"] = x.sizes();
    ctx->saved_data["window"] = std::vector<int64_t>{kernel, stride, padding};
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    // Autograd does not record the kernel: a gradient of this gradient would silently be missing.
    TORCH_CHECK(!torch::GradMode::is_enabled(),
                "resnet::max_pool2d: the fused backward cannot be differentiated again (create_graph)");
    const auto window = ctx->saved_data["window"].toIntVector();
    const torch::Tensor grad_x = kernels::max_pool_backward(
        grad_outputs[0].contiguous(torch::MemoryFormat::ChannelsLast), ctx->get_saved_variables()[0],
        ctx->saved_data["input_sizes"].toIntVector(), {window[0], window[1], window[2]});
    return {grad_x, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};
#endif

}  // namespace

bool max_pool2d_fused([[maybe_unused]] const torch::Tensor& x, [[maybe_unused]] int64_t kernel,
                      [[maybe_unused]] int64_t stride, [[maybe_unused]] int64_t padding) {
#if RESNET_WITH_CUDA_KERNELS
  const auto dtype = x.scalar_type();
  return x.is_cuda() && x.dim() == 4 && x.is_contiguous(torch::MemoryFormat::ChannelsLast) &&
         (dtype == torch::kFloat || dtype == torch::kBFloat16 || dtype == torch::kHalf) && kernel >= 1 &&
         kernel <= 16 && stride >= 1 && padding >= 0 && padding <= kernel / 2 && x.size(2) + 2 * padding >= kernel &&
         x.size(3) + 2 * padding >= kernel && x.numel() <= kernels::kMaxElements / 4;  // y may be larger
#else
  return false;
#endif
}

torch::Tensor max_pool2d(const torch::Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
#if RESNET_WITH_CUDA_KERNELS
  if (max_pool2d_fused(x, kernel, stride, padding)) return FusedMaxPool::apply(x, kernel, stride, padding);
#endif
  return torch::max_pool2d(x, kernel, stride, padding);
}

}  // namespace resnet
