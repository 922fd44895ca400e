#pragma once

// How this project trains a ResNet, shared by train_resnet50 and the scaling
// benchmark so that the benchmark measures exactly what the example runs.

#include <memory>

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

/// SGD with momentum (fused on GPUs); weight decay only on convolution and linear weights,
/// not on BatchNorm parameters and biases; over what `model` says this rank steps.
std::unique_ptr<ddp::optim::FusedSGD> make_sgd(const ddp::DistributedDataParallel<ResNet>& model, double lr,
                                               double momentum, double weight_decay);

}  // namespace resnet
