#include "resnet.h"

#include <tuple>
#include <vector>

#include <ddp/batch_norm.h>
#include <ddp/sync_batch_norm.h>

#include "max_pool.h"
#include "shortcut_join.h"

namespace resnet {
namespace {

constexpr int64_t kExpansion = 4;

torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

}  // namespace

torch::nn::AnyModule batch_norm(int64_t channels, const std::shared_ptr<ddp::ProcessGroup>& sync_group) {
  // Both start as the identity (weight 1, bias 0), as torchvision initialises BatchNorm.
  if (sync_group) return torch::nn::AnyModule(ddp::SyncBatchNorm(torch::nn::BatchNormOptions(channels), sync_group));
  return torch::nn::AnyModule(torch::nn::BatchNorm2d(channels));
}

namespace {

/// Whether `bn` (BatchNorm2d or SyncBatchNorm, which share their members)
/// runs through ddp::fused_batch_norm: in training, with running statistics
/// at a fixed momentum.
template <typename Norm>
bool fusable(const Norm& bn) {
  return bn.is_training() && bn.options.track_running_stats() && bn.options.momentum().has_value();
}

/// Layer `bn` through ddp::fused_batch_norm where fusable() (kAten: the
/// module's own ops, then add and ReLU). Its num_batches_tracked is left to
/// ResNetImpl::forward.
template <typename Norm>
bool fuse(Norm& bn, const torch::Tensor& x, const torch::Tensor& residual, bool relu, ddp::FusedBatchNormPath path,
          const std::shared_ptr<ddp::ProcessGroup>& sync_group, torch::Tensor& y) {
  if (!fusable(bn)) return false;
  y = ddp::fused_batch_norm(x, bn.weight, bn.bias, bn.running_mean, bn.running_var, residual,
                            ddp::FusedBatchNormOptions()
                                .momentum(bn.options.momentum().value())
                                .eps(bn.options.eps())
                                .relu(relu)
                                .path(path)
                                .process_group(sync_group));
  return true;
}

}  // namespace

torch::Tensor normalize(torch::nn::AnyModule& norm, const torch::Tensor& x, const torch::Tensor& residual, bool relu,
                        ddp::FusedBatchNormPath path) {
  torch::Tensor fused;
  if (auto* plain = norm.ptr()->as<torch::nn::BatchNorm2d>();
      plain && fuse(*plain, x, residual, relu, path, {}, fused)) {
    return fused;
  }
  if (auto* sync = norm.ptr()->as<ddp::SyncBatchNorm>();
      sync && fuse(*sync, x, residual, relu, path, sync->group(), fused)) {
    return fused;
  }
  torch::Tensor y = norm.forward(x);
  if (residual.defined()) y = y + residual;
  return relu ? torch::relu(y) : y;
}

BottleneckImpl::BottleneckImpl(int64_t in_channels, int64_t width, int64_t stride,
                               const std::shared_ptr<ddp::ProcessGroup>& sync_group) {
  const int64_t out_channels = width * kExpansion;
  conv1 = register_module("conv1", conv(in_channels, width, 1, 1));
  bn1 = batch_norm(width, sync_group);
  register_module("bn1", bn1.ptr());
  conv2 = register_module("conv2", conv(width, width, 3, stride));
  bn2 = batch_norm(width, sync_group);
  register_module("bn2", bn2.ptr());
  conv3 = register_module("conv3", conv(width, out_channels, 1, 1));
  bn3 = batch_norm(out_channels, sync_group);
  register_module("bn3", bn3.ptr());
  if (stride != 1 || in_channels != out_channels) {
    torch::nn::Sequential shortcut(conv(in_channels, out_channels, 1, stride));
    shortcut->push_back(batch_norm(out_channels, sync_group));
    downsample = register_module("downsample", shortcut);
  }
}

torch::Tensor BottleneckImpl::forward(torch::Tensor x) {
  torch::Tensor opened, identity = x;
  if (join_shortcut_gradient) {
    std::tie(opened, identity) = conv1x1_and_shortcut(x, conv1->weight);
  } else {
    opened = conv1(x);
  }
  if (downsample) {
    auto modules = downsample->begin();  // a convolution, then its BatchNorm (no ReLU)
    identity = normalize(modules[1], modules[0].forward(identity), {}, false, batch_norm_path);
  }
  torch::Tensor out = normalize(bn1, opened, {}, true, batch_norm_path);
  out = normalize(bn2, conv2(out), {}, true, batch_norm_path);
  return normalize(bn3, conv3(out), identity, true, batch_norm_path);
}

ResNetImpl::ResNetImpl(std::vector<int64_t> blocks, int64_t num_classes,
                       const std::shared_ptr<ddp::ProcessGroup>& sync_group) {
  conv1 = register_module("conv1", conv(3, 64, 7, 2));
  bn1 = batch_norm(64, sync_group);
  register_module("bn1", bn1.ptr());
  int64_t in_channels = 64;
  auto stage = [&](int64_t width, int64_t count, int64_t stride) {
    torch::nn::Sequential layer;
    for (int64_t i = 0; i < count; ++i) {
      layer->push_back(Bottleneck(in_channels, width, i == 0 ? stride : 1, sync_group));
      in_channels = width * kExpansion;
    }
    return layer;
  };
  layer1 = register_module("layer1", stage(64, blocks.at(0), 1));
  layer2 = register_module("layer2", stage(128, blocks.at(1), 2));
  layer3 = register_module("layer3", stage(256, blocks.at(2), 2));
  layer4 = register_module("layer4", stage(512, blocks.at(3), 2));
  fc = register_module("fc", torch::nn::Linear(in_channels, num_classes));

  // torchvision's initialisation: He (fan_out) for convolutions (BatchNorm starts as the identity).
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* c = module->as<torch::nn::Conv2d>()) {
      torch::nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
    }
  }
}

torch::Tensor ResNetImpl::forward(torch::Tensor x) {
  count_fused_batches();
  x = normalize(bn1, conv1(x), {}, true, batch_norm_path);
  x = fused_max_pool ? max_pool2d(x, 3, 2, 1) : torch::max_pool2d(x, 3, 2, 1);
  for (auto layer : {layer1, layer2, layer3, layer4}) x = layer->forward(x);
  x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
  return fc(x);
}

void ResNetImpl::count_fused_batches() {
  // As each module's own forward counts its batch, in one kernel for all of them where a kernel each would cost a
  // launch per layer (53 in ResNet-50). A model in eval mode fuses none.
  if (!is_training()) return;
  std::vector<torch::Tensor> counters;
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* plain = module->as<torch::nn::BatchNorm2d>(); plain && fusable(*plain)) {
      counters.push_back(plain->num_batches_tracked);
    } else if (auto* sync = module->as<ddp::SyncBatchNorm>(); sync && fusable(*sync)) {
      counters.push_back(sync->num_batches_tracked);
    }
  }
  if (!counters.empty()) at::_foreach_add_(counters, 1);
}

void ResNetImpl::set_batch_norm_path(ddp::FusedBatchNormPath path) {
  batch_norm_path = path;
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* block = module->as<Bottleneck>()) block->batch_norm_path = path;
  }
}

void ResNetImpl::set_join_shortcut_gradients(bool join) {
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* block = module->as<Bottleneck>()) block->join_shortcut_gradient = join;
  }
}

ResNet resnet50(int64_t num_classes, const std::shared_ptr<ddp::ProcessGroup>& sync_group) {
  return ResNet(std::vector<int64_t>{3, 4, 6, 3}, num_classes, sync_group);
}

}  // namespace resnet
