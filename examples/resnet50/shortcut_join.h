#pragma once

// A bottleneck block's input feeds two branches, the 1x1 convolution that
// opens the block and the shortcut, so its gradient is a sum. Autograd sums
// the two branches' gradients in a separate add kernel (one per block: 16 in
// ResNet-50, 0.96 ms of a 21 ms bf16 step on an H200, profile of
// 2026-11-28). Here the convolution's input gradient, a GEMM for a 1x1
// convolution over channels_last memory, adds the shortcut's gradient in its
// epilogue instead (MXNet's kAddTo), which saves writing the convolution's
// gradient and reading it back.

#include <utility>

#include <torch/torch.h>

namespace resnet {

/// {conv2d(x, weight), x}: the block's first convolution (1x1, stride 1, no
/// padding or bias) and its input again for the shortcut, as one autograd
/// node, whose backward adds the convolution's input gradient into the
/// shortcut's (in place: the shortcut's gradient reaches this node only
/// after every other user of it in the block has run). The convolution
/// computes in x's dtype. x: [N, C, H, W] channels_last (else, and for other
/// weights, shortcut_join_applies is false and this is conv2d and x itself).
std::pair<torch::Tensor, torch::Tensor> conv1x1_and_shortcut(const torch::Tensor& x, const torch::Tensor& weight);

/// Whether conv1x1_and_shortcut joins the gradients for x and weight.
bool shortcut_join_applies(const torch::Tensor& x, const torch::Tensor& weight);

}  // namespace resnet
