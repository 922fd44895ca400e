#pragma once

// ResNet-50's max pooling as two CUDA kernels over channels-last activations.
// ATen's NHWC kernels keep an int64 index per output element for backward
// (8 bytes beside a 2-byte bf16 value) and run at a fraction of the memory
// bandwidth: 1.33 ms of a 21 ms bf16 step on an H200 (2026-11-28). Here the
// window offset of each maximum is one byte, and each thread moves 16 bytes
// of channels at a time.
//
// No CUDA headers here: max_pool.cpp includes it. Defined only where
// max_pool_kernels.cu is compiled (RESNET_WITH_CUDA_KERNELS).

#include <cstdint>
#include <utility>

#include <ATen/core/Tensor.h>

namespace resnet::kernels {

/// A square pooling window: kernel x kernel, moved by `stride`, over an input
/// padded by `padding` on each side (padding never wins). kernel^2 <= 256.
struct PoolWindow {
  int64_t kernel, stride, padding;
};

/// The most elements an input or output may have: the kernels count in 32
/// bits.
constexpr int64_t kMaxElements = INT32_MAX;

/// Max pooling of x [N, C, H, W] (CUDA, fp32, bf16 or fp16, channels_last):
/// {y [N, C, OH, OW] channels_last, offsets [N, OH, OW, C] uint8}, where an
/// offset is the row-major position of its maximum in the window. Ties go to
/// the first position and NaN wins, as in ATen's kernel, so the gradient
/// goes where ATen's would.
std::pair<at::Tensor, at::Tensor> max_pool_forward(const at::Tensor& x, const PoolWindow& window);

/// The gradient of max_pool_forward's x, given y's (channels_last) and the
/// offsets: each input element sums, in fp32, the output gradients of the
/// windows whose maximum it was (in ATen's order).
at::Tensor max_pool_backward(const at::Tensor& grad_y, const at::Tensor& offsets, at::IntArrayRef input_sizes,
                             const PoolWindow& window);

}  // namespace resnet::kernels
