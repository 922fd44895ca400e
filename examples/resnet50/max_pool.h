#pragma once

// ResNet-50's max pooling (3x3, stride 2, after the stem) on fused CUDA
// kernels where they apply (max_pool_kernels.h says why), ATen's op elsewhere.

#include <cstdint>

#include <torch/torch.h>

namespace resnet {

/// torch::max_pool2d(x, kernel, stride, padding) with square windows. A
/// channels_last CUDA x (fp32, bf16, fp16) of a build with the examples'
/// CUDA kernels takes them: the same values, and the same gradients (the
/// same elements get them, summed in the same order); anything else takes
/// ATen's op. The kernels' backward cannot be differentiated again.
torch::Tensor max_pool2d(const torch::Tensor& x, int64_t kernel, int64_t stride, int64_t padding);

/// Whether max_pool2d takes the fused kernels for x.
bool max_pool2d_fused(const torch::Tensor& x, int64_t kernel, int64_t stride, int64_t padding);

}  // namespace resnet
