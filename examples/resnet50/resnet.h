#pragma once

// ResNet-50 as torchvision builds it (v1.5: the stride sits in the 3x3
// convolution), with torchvision's parameter names, so state dicts line up.

#include <memory>

#include <torch/torch.h>

#include <ddp/batch_norm.h>
#include <ddp/process_group.h>

namespace resnet {

/// The BatchNorm layers: torch::nn::BatchNorm2d, or with `sync_group`
/// ddp::SyncBatchNorm over its ranks (--sync-bn). Same parameter names.
torch::nn::AnyModule batch_norm(int64_t channels, const std::shared_ptr<ddp::ProcessGroup>& sync_group);

/// relu?(norm(x) + residual?): a BatchNorm2d or SyncBatchNorm (with its
/// group) in training goes through ddp::fused_batch_norm on `path` (fused
/// kernels on CUDA, ATen's ops elsewhere and for kAten) and leaves its
/// num_batches_tracked to the caller (ResNetImpl::count_fused_batches);
/// anything else runs as the module, then add and ReLU.
torch::Tensor normalize(torch::nn::AnyModule& norm, const torch::Tensor& x, const torch::Tensor& residual, bool relu,
                        ddp::FusedBatchNormPath path);

struct BottleneckImpl : torch::nn::Module {
  BottleneckImpl(int64_t in_channels, int64_t width, int64_t stride,
                 const std::shared_ptr<ddp::ProcessGroup>& sync_group = nullptr);
  /// Leaves the fused layers' batch counts to ResNetImpl::count_fused_batches.
  torch::Tensor forward(torch::Tensor x);

  ddp::FusedBatchNormPath batch_norm_path = ddp::FusedBatchNormPath::kAuto;  ///< See normalize().
  /// conv1 and the shortcut through conv1x1_and_shortcut: conv1's input
  /// gradient adds the shortcut's in its GEMM, not in a separate add.
  bool join_shortcut_gradient = true;

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  torch::nn::AnyModule bn1, bn2, bn3;
  torch::nn::Sequential downsample{nullptr};
};
TORCH_MODULE(Bottleneck);

struct ResNetImpl : torch::nn::Module {
  /// blocks: bottlenecks per stage ({3, 4, 6, 3} for ResNet-50).
  /// `sync_group`: BatchNorm statistics over its ranks (null: each rank's own).
  ResNetImpl(std::vector<int64_t> blocks, int64_t num_classes,
             const std::shared_ptr<ddp::ProcessGroup>& sync_group = nullptr);
  torch::Tensor forward(torch::Tensor x);
  /// Which kernels BatchNorm, add and ReLU run on in training: ddp::fused_batch_norm's
  /// (kAuto, the default, kCudnn, kLibddp) or ATen's separate ops (kAten).
  void set_batch_norm_path(ddp::FusedBatchNormPath path);
  /// Every block's BottleneckImpl::join_shortcut_gradient.
  void set_join_shortcut_gradients(bool join);

  torch::nn::Conv2d conv1{nullptr};
  torch::nn::AnyModule bn1;
  ddp::FusedBatchNormPath batch_norm_path = ddp::FusedBatchNormPath::kAuto;
  /// The stem's max pooling through resnet::max_pool2d (fused kernels where
  /// they apply), not torch::max_pool2d.
  bool fused_max_pool = true;
  torch::nn::Sequential layer1{nullptr}, layer2{nullptr}, layer3{nullptr}, layer4{nullptr};
  torch::nn::Linear fc{nullptr};

 private:
  /// num_batches_tracked += 1 for every BatchNorm layer that normalize()
  /// fuses, in one kernel (forward() calls it first).
  void count_fused_batches();
};
TORCH_MODULE(ResNet);

/// ResNet-50: 25,557,032 parameters with 1000 classes. `sync_group`: as ResNetImpl's.
ResNet resnet50(int64_t num_classes = 1000, const std::shared_ptr<ddp::ProcessGroup>& sync_group = nullptr);

}  // namespace resnet
