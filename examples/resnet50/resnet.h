#pragma once

// ResNet-50 as torchvision builds it (v1.5: the stride sits in the 3x3
// convolution), with torchvision's parameter names, so state dicts line up.

#include <torch/torch.h>

namespace resnet {

struct BottleneckImpl : torch::nn::Module {
  BottleneckImpl(int64_t in_channels, int64_t width, int64_t stride);
  torch::Tensor forward(torch::Tensor x);

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, bn3{nullptr};
  torch::nn::Sequential downsample{nullptr};
};
TORCH_MODULE(Bottleneck);

struct ResNetImpl : torch::nn::Module {
  /// blocks: bottlenecks per stage ({3, 4, 6, 3} for ResNet-50).
  ResNetImpl(std::vector<int64_t> blocks, int64_t num_classes);
  torch::Tensor forward(torch::Tensor x);

  torch::nn::Conv2d conv1{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr};
  torch::nn::Sequential layer1{nullptr}, layer2{nullptr}, layer3{nullptr}, layer4{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet);

/// ResNet-50: 25,557,032 parameters with 1000 classes.
ResNet resnet50(int64_t num_classes = 1000);

}  // namespace resnet
