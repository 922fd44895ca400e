#include "batchnorm/cudnn_bn_add_relu.h"

#include <stdexcept>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <cudnn.h>

namespace bench {
namespace {

void check(cudnnStatus_t status, const char* call) {
  if (status != CUDNN_STATUS_SUCCESS) {
    throw std::runtime_error(std::string(call) + " failed: " + cudnnGetErrorString(status));
  }
}
#define CUDNN_CHECK(call) check((call), #call)

cudnnDataType_t data_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return CUDNN_DATA_FLOAT;
    case at::kHalf: return CUDNN_DATA_HALF;
    case at::kBFloat16: return CUDNN_DATA_BFLOAT16;
    default: throw std::invalid_argument("cuDNN BatchNorm trial: fp32, fp16 or bf16 only");
  }
}

}  // namespace

struct CudnnBnAddRelu::State {
  cudnnHandle_t handle = nullptr;
  cudnnTensorDescriptor_t data = nullptr, per_channel = nullptr;
  cudnnActivationDescriptor_t activation = nullptr;
  cudnnBatchNormOps_t ops = CUDNN_BATCHNORM_OPS_BN;
  at::Tensor workspace, reserve, y, dx, dz, dweight, dbias, save_mean, save_inv_var;
};

CudnnBnAddRelu::CudnnBnAddRelu(const at::Tensor& input, bool residual, bool relu) : state_(std::make_unique<State>()) {
  State& s = *state_;
  const auto n = static_cast<int>(input.size(0)), c = static_cast<int>(input.size(1));
  const auto h = static_cast<int>(input.size(2)), w = static_cast<int>(input.size(3));
  CUDNN_CHECK(cudnnCreate(&s.handle));
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&s.data));
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(s.data, CUDNN_TENSOR_NHWC, data_type(input.scalar_type()), n, c, h, w));
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&s.per_channel));
  CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(s.per_channel, s.data, CUDNN_BATCHNORM_SPATIAL_PERSISTENT));
  CUDNN_CHECK(cudnnCreateActivationDescriptor(&s.activation));
  CUDNN_CHECK(cudnnSetActivationDescriptor(s.activation, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
  s.ops = residual ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
                   : (relu ? CUDNN_BATCHNORM_OPS_BN_ACTIVATION : CUDNN_BATCHNORM_OPS_BN);
  if (residual && !relu) throw std::invalid_argument("cuDNN's BatchNorm + add always ends in the activation");
  const cudnnActivationDescriptor_t activation = s.ops == CUDNN_BATCHNORM_OPS_BN ? nullptr : s.activation;
  const cudnnTensorDescriptor_t z = residual ? s.data : nullptr;
  size_t forward_bytes = 0, backward_bytes = 0, reserve_bytes = 0;
  // Unsupported configurations fail here already (or in the first call).
  cudnnStatus_t status = cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
      s.handle, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, s.ops, s.data, z, s.data, s.per_channel, activation,
      &forward_bytes);
  if (status == CUDNN_STATUS_SUCCESS) {
    status = cudnnGetBatchNormalizationBackwardExWorkspaceSize(s.handle, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, s.ops,
                                                               s.data, s.data, s.data, z, s.data, s.per_channel,
                                                               activation, &backward_bytes);
  }
  if (status == CUDNN_STATUS_SUCCESS) {
    status = cudnnGetBatchNormalizationTrainingExReserveSpaceSize(s.handle, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, s.ops,
                                                                  activation, s.data, &reserve_bytes);
  }
  if (status != CUDNN_STATUS_SUCCESS) {
    unsupported_ = cudnnGetErrorString(status);
    return;
  }
  const auto bytes = input.options().dtype(at::kByte);
  s.workspace = at::empty({static_cast<int64_t>(std::max(forward_bytes, backward_bytes)) + 1}, bytes);
  s.reserve = at::empty({static_cast<int64_t>(reserve_bytes) + 1}, bytes);
  s.y = at::empty_like(input);
  s.dx = at::empty_like(input);
  if (residual) s.dz = at::empty_like(input);
  const auto fp32 = input.options().dtype(at::kFloat);
  s.dweight = at::empty({c}, fp32);
  s.dbias = at::empty({c}, fp32);
  s.save_mean = at::empty({c}, fp32);
  s.save_inv_var = at::empty({c}, fp32);
}

CudnnBnAddRelu::~CudnnBnAddRelu() {
  if (!state_) return;
  if (state_->activation) cudnnDestroyActivationDescriptor(state_->activation);
  if (state_->per_channel) cudnnDestroyTensorDescriptor(state_->per_channel);
  if (state_->data) cudnnDestroyTensorDescriptor(state_->data);
  if (state_->handle) cudnnDestroy(state_->handle);
}

void CudnnBnAddRelu::forward_backward(const at::Tensor& x, const at::Tensor& z, const at::Tensor& dy,
                                      const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& running_mean,
                                      const at::Tensor& running_var) {
  if (!unsupported_.empty()) throw std::logic_error("cuDNN does not run this configuration: " + unsupported_);
  State& s = *state_;
  const float one = 1, zero = 0;
  const double eps = 1e-5, momentum = 0.1;
  const cudnnActivationDescriptor_t activation = s.ops == CUDNN_BATCHNORM_OPS_BN ? nullptr : s.activation;
  const bool residual = z.defined();
  CUDNN_CHECK(cudnnSetStream(s.handle, c10::cuda::getCurrentCUDAStream().stream()));  // recorded into a graph too
  CUDNN_CHECK(cudnnBatchNormalizationForwardTrainingEx(
      s.handle, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, s.ops, &one, &zero, s.data, x.data_ptr(),
      residual ? s.data : nullptr, residual ? z.data_ptr() : nullptr, s.data, s.y.data_ptr(), s.per_channel,
      weight.data_ptr(), bias.data_ptr(), momentum, running_mean.data_ptr(), running_var.data_ptr(), eps,
      s.save_mean.data_ptr(), s.save_inv_var.data_ptr(), activation, s.workspace.data_ptr(),
      static_cast<size_t>(s.workspace.numel()), s.reserve.data_ptr(), static_cast<size_t>(s.reserve.numel())));
  CUDNN_CHECK(cudnnBatchNormalizationBackwardEx(
      s.handle, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, s.ops, &one, &zero, &one, &zero, s.data, x.data_ptr(), s.data,
      s.y.data_ptr(), s.data, dy.data_ptr(), residual ? s.data : nullptr, residual ? s.dz.data_ptr() : nullptr, s.data,
      s.dx.data_ptr(), s.per_channel, weight.data_ptr(), bias.data_ptr(), s.dweight.data_ptr(), s.dbias.data_ptr(), eps,
      s.save_mean.data_ptr(), s.save_inv_var.data_ptr(), activation, s.workspace.data_ptr(),
      static_cast<size_t>(s.workspace.numel()), s.reserve.data_ptr(), static_cast<size_t>(s.reserve.numel())));
}

const at::Tensor& CudnnBnAddRelu::output() const { return state_->y; }
const at::Tensor& CudnnBnAddRelu::grad_input() const { return state_->dx; }
const at::Tensor& CudnnBnAddRelu::grad_residual() const { return state_->dz; }
const at::Tensor& CudnnBnAddRelu::grad_weight() const { return state_->dweight; }
const at::Tensor& CudnnBnAddRelu::grad_bias() const { return state_->dbias; }

}  // namespace bench
