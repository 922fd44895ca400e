#include "batchnorm/cudnn_batch_norm.h"

#include <limits>

#include <ATen/ATen.h>
#include <ATen/cudnn/Handle.h>
#include <torch/csrc/autograd/custom_function.h>

#include "batchnorm/absent_tensor.h"
#include "cuda/cudnn_check.h"

namespace ddp::detail {
namespace {

// The NHWC kernels that keep a channel's activations on chip. (The
// Ex functions are deprecated in cuDNN 9 in favour of its graph API, which
// has no training BatchNorm with add and ReLU of its own yet.)
constexpr cudnnBatchNormMode_t kMode = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;

/// One cuDNN descriptor, destroyed with its owner.
template <typename Descriptor, cudnnStatus_t (*Create)(Descriptor*), cudnnStatus_t (*Destroy)(Descriptor)>
class Owned {
 public:
  Owned() { DDP_CUDNN_CHECK(Create(&value_)); }
  ~Owned() { Destroy(value_); }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  Descriptor get() const { return value_; }

 private:
  Descriptor value_ = nullptr;
};

/// The descriptors of one configuration: the activations (input, residual,
/// output and their gradients share one), the per-channel fp32 tensors, ReLU.
class Descriptors {
 public:
  Descriptors(const at::Tensor& input, bool residual, bool relu)
      : ops_(residual ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
                      : (relu ? CUDNN_BATCHNORM_OPS_BN_ACTIVATION : CUDNN_BATCHNORM_OPS_BN)),
        residual_(residual) {
    const cudnnDataType_t type = input.scalar_type() == at::kFloat  ? CUDNN_DATA_FLOAT
                                 : input.scalar_type() == at::kHalf ? CUDNN_DATA_HALF
                                                                    : CUDNN_DATA_BFLOAT16;
    DDP_CUDNN_CHECK(cudnnSetTensor4dDescriptor(data_.get(), CUDNN_TENSOR_NHWC, type, static_cast<int>(input.size(0)),
                                               static_cast<int>(input.size(1)), static_cast<int>(input.size(2)),
                                               static_cast<int>(input.size(3))));
    DDP_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(per_channel_.get(), data_.get(), kMode));
    DDP_CUDNN_CHECK(cudnnSetActivationDescriptor(activation_.get(), CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0));
  }

  cudnnBatchNormOps_t ops() const { return ops_; }
  cudnnTensorDescriptor_t data() const { return data_.get(); }
  /// The residual's (and its gradient's) descriptor, null without one.
  cudnnTensorDescriptor_t residual() const { return residual_ ? data_.get() : nullptr; }
  cudnnTensorDescriptor_t per_channel() const { return per_channel_.get(); }
  cudnnActivationDescriptor_t activation() const {
    return ops_ == CUDNN_BATCHNORM_OPS_BN ? nullptr : activation_.get();
  }

  /// Bytes of the forward's and the backward's workspace and of the reserve
  /// the forward leaves the backward (ReLU's mask); cuDNN's status where it
  /// does not run the configuration.
  cudnnStatus_t sizes(cudnnHandle_t handle, size_t& forward, size_t& backward, size_t& reserve) const {
    cudnnStatus_t status = cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
        handle, kMode, ops_, data(), residual(), data(), per_channel(), activation(), &forward);
    if (status != CUDNN_STATUS_SUCCESS) return status;
    status = cudnnGetBatchNormalizationBackwardExWorkspaceSize(handle, kMode, ops_, data(), data(), data(), residual(),
                                                               data(), per_channel(), activation(), &backward);
    if (status != CUDNN_STATUS_SUCCESS) return status;
    return cudnnGetBatchNormalizationTrainingExReserveSpaceSize(handle, kMode, ops_, activation(), data(), &reserve);
  }

 private:
  Owned<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor> data_, per_channel_;
  Owned<cudnnActivationDescriptor_t, cudnnCreateActivationDescriptor, cudnnDestroyActivationDescriptor> activation_;
  cudnnBatchNormOps_t ops_;
  bool residual_;
};

at::Tensor bytes(size_t count, const at::Tensor& like) {
  return at::empty({static_cast<int64_t>(count)}, like.options().dtype(at::kByte));
}

/// Saves the input, the output (ReLU's input to the backward), weight, bias,
/// the batch's mean and inverse standard deviation, and cuDNN's reserve.
class CudnnBatchNormFunction : public torch::autograd::Function<CudnnBatchNormFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& residual_or_empty, const at::Tensor& weight, const at::Tensor& bias,
                            const at::Tensor& running_mean, const at::Tensor& running_var, double momentum, double eps,
                            bool relu) {
    const at::Tensor residual = unless_empty(residual_or_empty);
    const Descriptors descriptors(input, residual.defined(), relu);
    const cudnnHandle_t handle = at::native::getCudnnHandle();  // on the current stream
    size_t forward_bytes = 0, backward_bytes = 0, reserve_bytes = 0;
    DDP_CUDNN_CHECK(descriptors.sizes(handle, forward_bytes, backward_bytes, reserve_bytes));
    const at::Tensor workspace = bytes(forward_bytes, input);
    const at::Tensor reserve = bytes(reserve_bytes, input);
    at::Tensor output = at::empty_like(input);
    const auto floats = input.options().dtype(at::kFloat);
    const at::Tensor mean = at::empty({input.size(1)}, floats), invstd = at::empty({input.size(1)}, floats);
    const float one = 1, zero = 0;
    DDP_CUDNN_CHECK(cudnnBatchNormalizationForwardTrainingEx(
        handle, kMode, descriptors.ops(), &one, &zero, descriptors.data(), input.data_ptr(), descriptors.residual(),
        residual.defined() ? residual.data_ptr() : nullptr, descriptors.data(), output.data_ptr(),
        descriptors.per_channel(), weight.data_ptr(), bias.data_ptr(), momentum, running_mean.data_ptr(),
        running_var.data_ptr(), eps, mean.data_ptr(), invstd.data_ptr(), descriptors.activation(), workspace.data_ptr(),
        forward_bytes, reserve.data_ptr(), reserve_bytes));
    ctx->save_for_backward({input, output, weight, bias, mean, invstd, reserve});
    ctx->saved_data["residual"] = residual.defined();
    ctx->saved_data["relu"] = relu;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["backward_bytes"] = static_cast<int64_t>(backward_bytes);  // backward need not ask again
    return output;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &input = saved[0], &output = saved[1], &weight = saved[2], &bias = saved[3];
    const at::Tensor &mean = saved[4], &invstd = saved[5], &reserve = saved[6];
    const bool residual = ctx->saved_data["residual"].toBool();
    const Descriptors descriptors(input, residual, ctx->saved_data["relu"].toBool());
    const cudnnHandle_t handle = at::native::getCudnnHandle();
    const auto backward_bytes = static_cast<size_t>(ctx->saved_data["backward_bytes"].toInt());
    const at::Tensor workspace = bytes(backward_bytes, input);
    // cuDNN reads the gradient in the activations' layout.
    const at::Tensor grad_output = grads[0].contiguous(at::MemoryFormat::ChannelsLast);
    at::Tensor grad_input = at::empty_like(input);
    at::Tensor grad_residual = residual ? at::empty_like(input) : at::Tensor();
    at::Tensor grad_weight = at::empty_like(weight), grad_bias = at::empty_like(bias);
    const float one = 1, zero = 0;
    DDP_CUDNN_CHECK(cudnnBatchNormalizationBackwardEx(
        handle, kMode, descriptors.ops(), &one, &zero, &one, &zero, descriptors.data(), input.data_ptr(),
        descriptors.data(), output.data_ptr(), descriptors.data(), grad_output.data_ptr(), descriptors.residual(),
        residual ? grad_residual.data_ptr() : nullptr, descriptors.data(), grad_input.data_ptr(),
        descriptors.per_channel(), weight.data_ptr(), bias.data_ptr(), grad_weight.data_ptr(), grad_bias.data_ptr(),
        ctx->saved_data["eps"].toDouble(), mean.data_ptr(), invstd.data_ptr(), descriptors.activation(),
        workspace.data_ptr(), backward_bytes, reserve.data_ptr(), static_cast<size_t>(reserve.numel())));
    return {grad_input,   grad_residual, grad_weight,  grad_bias,   at::Tensor(),
            at::Tensor(), at::Tensor(),  at::Tensor(), at::Tensor()};
  }
};

bool fits_int(int64_t value) { return value <= std::numeric_limits<int>::max(); }

}  // namespace

bool cudnn_runs_batch_norm(const at::Tensor& input, const at::Tensor& residual, bool relu, double eps) {
  const auto type = input.scalar_type();
  const bool layout = input.is_cuda() && input.dim() == 4 && input.numel() > 0 &&
                      (type == at::kFloat || type == at::kHalf || type == at::kBFloat16) &&
                      input.is_contiguous(at::MemoryFormat::ChannelsLast) && fits_int(input.size(0)) &&
                      fits_int(input.size(1)) && fits_int(input.size(2)) && fits_int(input.size(3));
  const bool residual_fits =
      !residual.defined() || (residual.sizes() == input.sizes() && residual.scalar_type() == type &&
                              residual.is_contiguous(at::MemoryFormat::ChannelsLast));
  // cuDNN adds a residual only on the way into the activation.
  if (!layout || !residual_fits || (residual.defined() && !relu) || eps < CUDNN_BN_MIN_EPSILON ||
      !at::globalContext().userEnabledCuDNN()) {
    return false;
  }
  const Descriptors descriptors(input, residual.defined(), relu);
  size_t forward_bytes = 0, backward_bytes = 0, reserve_bytes = 0;
  return descriptors.sizes(at::native::getCudnnHandle(), forward_bytes, backward_bytes, reserve_bytes) ==
         CUDNN_STATUS_SUCCESS;
}

at::Tensor cudnn_batch_norm(const at::Tensor& input, const at::Tensor& residual, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& running_mean, const at::Tensor& running_var,
                            double momentum, double eps, bool relu) {
  return CudnnBatchNormFunction::apply(input, or_empty(residual, input), weight, bias, running_mean, running_var,
                                       momentum, eps, relu);
}

}  // namespace ddp::detail
