#include "resnet.h"

namespace resnet {
namespace {

constexpr int64_t kExpansion = 4;

torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

}  // namespace

BottleneckImpl::BottleneckImpl(int64_t in_channels, int64_t width, int64_t stride) {
  const int64_t out_channels = width * kExpansion;
  conv1 = register_module("conv1", conv(in_channels, width, 1, 1));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(width));
  conv2 = register_module("conv2", conv(width, width, 3, stride));
  bn2 = register_module("bn2", torch::nn::BatchNorm2d(width));
  conv3 = register_module("conv3", conv(width, out_channels, 1, 1));
  bn3 = register_module("bn3", torch::nn::BatchNorm2d(out_channels));
  if (stride != 1 || in_channels != out_channels) {
    downsample = register_module(
        "downsample", torch::nn::Sequential(conv(in_channels, out_channels, 1, stride), torch::nn::BatchNorm2d(out_channels)));
  }
}

torch::Tensor BottleneckImpl::forward(torch::Tensor x) {
  torch::Tensor identity = downsample ? downsample->forward(x) : x;
  torch::Tensor out = torch::relu(bn1(conv1(x)));
  out = torch::relu(bn2(conv2(out)));
  out = bn3(conv3(out));
  return torch::relu(out + identity);
}

ResNetImpl::ResNetImpl(std::vector<int64_t> blocks, int64_t num_classes) {
  conv1 = register_module("conv1", conv(3, 64, 7, 2));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(64));
  int64_t in_channels = 64;
  auto stage = [&](int64_t width, int64_t count, int64_t stride) {
    torch::nn::Sequential layer;
    for (int64_t i = 0; i < count; ++i) {
      layer->push_back(Bottleneck(in_channels, width, i == 0 ? stride : 1));
      in_channels = width * kExpansion;
    }
    return layer;
  };
  layer1 = register_module("layer1", stage(64, blocks.at(0), 1));
  layer2 = register_module("layer2", stage(128, blocks.at(1), 2));
  layer3 = register_module("layer3", stage(256, blocks.at(2), 2));
  layer4 = register_module("layer4", stage(512, blocks.at(3), 2));
  fc = register_module("fc", torch::nn::Linear(in_channels, num_classes));

  // torchvision's initialisation: He (fan_out) for convolutions, BatchNorm as identity.
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* c = module->as<torch::nn::Conv2d>()) {
      torch::nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
    } else if (auto* b = module->as<torch::nn::BatchNorm2d>()) {
      torch::nn::init::ones_(b->weight);
      torch::nn::init::zeros_(b->bias);
    }
  }
}

torch::Tensor ResNetImpl::forward(torch::Tensor x) {
  x = torch::relu(bn1(conv1(x)));
  x = torch::max_pool2d(x, 3, 2, 1);
  for (auto layer : {layer1, layer2, layer3, layer4}) x = layer->forward(x);
  x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
  return fc(x);
}

ResNet resnet50(int64_t num_classes) { return ResNet(std::vector<int64_t>{3, 4, 6, 3}, num_classes); }

}  // namespace resnet
