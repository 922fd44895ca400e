#include "resnet_training.h"

#include <vector>

#include <ddp/errors.h>

namespace resnet {

void to_channels_last(ResNetImpl& model) {
  for (auto& param : model.parameters()) {
    if (param.dim() == 4) param.set_data(param.data().contiguous(at::MemoryFormat::ChannelsLast));
  }
}

void check_precision(const ddp::PrecisionPolicy& policy) {
  if (policy.uses_float8()) {
    throw ddp::UsageError(
        "fp8 speeds up linear layers (ddp::Float8Linear); ResNet-50's work is in its convolutions, which have no "
        "FP8 path here. Use bf16");
  }
}

ddp::FusedBatchNormPath parse_batch_norm_path(const std::string& name) {
  if (name == "auto") return ddp::FusedBatchNormPath::kAuto;
  if (name == "cudnn") return ddp::FusedBatchNormPath::kCudnn;
  if (name == "libddp") return ddp::FusedBatchNormPath::kLibddp;
  if (name == "aten") return ddp::FusedBatchNormPath::kAten;
  throw ddp::UsageError("--bn must be auto, cudnn, libddp or aten, got '" + name + "'");
}

std::unique_ptr<ddp::optim::FusedSGD> make_sgd(const ddp::DistributedDataParallel<ResNet>& model, double lr,
                                               double momentum, double weight_decay) {
  std::vector<at::Tensor> decay, no_decay;
  for (auto& param : model.module()->parameters()) (param.dim() > 1 ? decay : no_decay).push_back(param);
  const auto sgd = torch::optim::SGDOptions(lr).momentum(momentum);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(model.local_parameters(decay),
                      std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(sgd).weight_decay(weight_decay)));
  groups.emplace_back(model.local_parameters(no_decay), std::make_unique<torch::optim::SGDOptions>(sgd));
  return std::make_unique<ddp::optim::FusedSGD>(std::move(groups), sgd);
}

}  // namespace resnet
