#pragma once

// cuDNN's own fused BatchNorm + add + ReLU for NHWC training
// (cudnnBatchNormalizationForwardTrainingEx / BackwardEx with
// CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION, the persistent spatial mode: the
// path MXNet and apex's bnp use), for fused_bn_bench to hold against
// ddp::fused_batch_norm. A trial, not a libddp path: it lives here.

#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

namespace bench {

class CudnnBnAddRelu {
 public:
  /// `input` [N, C, H, W] channels_last; `residual`: with an add, else undefined.
  CudnnBnAddRelu(const at::Tensor& input, bool residual, bool relu);
  ~CudnnBnAddRelu();
  CudnnBnAddRelu(const CudnnBnAddRelu&) = delete;
  CudnnBnAddRelu& operator=(const CudnnBnAddRelu&) = delete;

  /// "" where cuDNN runs this configuration, else why not (its status).
  const std::string& unsupported() const { return unsupported_; }

  /// One training forward (y = relu(bn(x) + z)) and its backward from `dy`;
  /// results in output(), grad_input(), grad_residual(), grad_weight(), grad_bias().
  void forward_backward(const at::Tensor& x, const at::Tensor& z, const at::Tensor& dy, const at::Tensor& weight,
                        const at::Tensor& bias, const at::Tensor& running_mean, const at::Tensor& running_var);

  const at::Tensor& output() const;
  const at::Tensor& grad_input() const;
  const at::Tensor& grad_residual() const;
  const at::Tensor& grad_weight() const;
  const at::Tensor& grad_bias() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
  std::string unsupported_;
};

}  // namespace bench
