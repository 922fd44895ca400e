#pragma once

// How this project trains a ResNet, shared by train_resnet50 and the scaling
// benchmark so that the benchmark measures exactly what the example runs.

#include <memory>
#include <string>

#include <torch/torch.h>

#include <ddp/distributed_data_parallel.h>
#include <ddp/optim.h>
#include <ddp/precision.h>

#include "resnet.h"

namespace resnet {

/// Convolution weights in channels_last: cuDNN's fastest convolutions on
/// tensor cores read NHWC. Call after moving the model to its device.
void to_channels_last(ResNetImpl& model);

/// UsageError for a precision ResNet-50 is not trained in: fp8, which only
/// speeds up linear layers.
void check_precision(const ddp::PrecisionPolicy& policy);

/// The --bn flag's values: auto | cudnn | libddp | aten (ddp::FusedBatchNormPath);
/// UsageError naming them for anything else.
ddp::FusedBatchNormPath parse_batch_norm_path(const std::string& name);
/// What --bn takes, for help lines.
constexpr const char* kBatchNormPathHelp =
    "BatchNorm, residual add and ReLU in training: auto (cuDNN's fused kernels where cuDNN runs the shape, else "
    "libddp's), cudnn, libddp (ddp::fused_batch_norm's own kernels) or aten (ATen's separate ops); with --sync-bn, "
    "auto and libddp run libddp's kernels with the all-reduces between their passes, cudnn and aten ATen's ops";

/// SGD with momentum (fused on GPUs); weight decay only on convolution and linear weights,
/// not on BatchNorm parameters and biases; over what `model` says this rank steps.
std::unique_ptr<ddp::optim::FusedSGD> make_sgd(const ddp::DistributedDataParallel<ResNet>& model, double lr,
                                               double momentum, double weight_decay);

}  // namespace resnet
