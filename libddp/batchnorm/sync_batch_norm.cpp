#include <ddp/sync_batch_norm.h>

#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>

#include <ddp/batch_norm.h>
#include <ddp/communicator.h>
#include <ddp/errors.h>

#include "batchnorm/group_capsule.h"

namespace ddp {
namespace {

/// `local` summed over the ranks, differentiable: every rank's loss depends
/// on the sum, so the gradient of each rank's addend is the sum of the
/// ranks' gradients. One all-reduce in forward, one in backward.
class AllReduceSum : public torch::autograd::Function<AllReduceSum> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& local,
                            const std::shared_ptr<ProcessGroup>& group) {
    ctx->saved_data["group"] = detail::capsule_of(group);
    at::Tensor summed = local.clone();
    group->communicator().all_reduce(summed)->wait_stream();
    return summed;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    // (Autograd gives zeros for an unused output, so every rank joins the collective.)
    at::Tensor grad = grads[0].clone();
    detail::group_in(ctx->saved_data["group"]).communicator().all_reduce(grad)->wait_stream();
    return {grad, at::Tensor()};
  }
};

}  // namespace

at::Tensor sync_batch_norm(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                           const at::Tensor& running_mean, const at::Tensor& running_var, double momentum, double eps,
                           const std::shared_ptr<ProcessGroup>& group) {
  if (input.dim() < 2) {
    throw UsageError(fmt::format("ddp::sync_batch_norm: input must be [N, C, ...], got {} dimensions", input.dim()));
  }
  const std::int64_t channels = input.size(1);
  std::vector<std::int64_t> reduced{0};
  for (std::int64_t d = 2; d < input.dim(); ++d) reduced.push_back(d);
  std::vector<std::int64_t> per_channel(static_cast<std::size_t>(input.dim()), 1);
  per_channel[1] = channels;
  const at::ScalarType stat_type = input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor x = input.to(stat_type);
  const std::int64_t count = channels > 0 ? input.numel() / channels : 0;

  // This rank's count, count * mean and count * E[x^2] (from its centred
  // variance, so that the sum of squares does not cancel), in fp64.
  at::Tensor local;
  if (count > 0) {
    const auto [variance, mean] = at::var_mean(x, reduced, /*unbiased=*/false, /*keepdim=*/false);
    const at::Tensor mean64 = mean.to(at::kDouble);
    const at::Tensor n = at::full({1}, static_cast<double>(count), mean64.options());
    local = at::cat({n, mean64 * static_cast<double>(count),
                     (variance.to(at::kDouble) + mean64 * mean64) * static_cast<double>(count)});
  } else {
    // Zeros, but as sums of the (empty) input, so that backward still reaches
    // the all-reduce's backward, which the other ranks' backward meets.
    const at::Tensor zeros = x.sum(reduced).to(at::kDouble);
    local = at::cat({at::zeros({1}, zeros.options()), zeros, zeros});
  }
  const at::Tensor global = AllReduceSum::apply(local, group);
  // All on the device: a host read of the count would stall every layer.
  const at::Tensor total = global.narrow(0, 0, 1);
  const at::Tensor mean = global.narrow(0, 1, channels) / total;
  const at::Tensor variance = (global.narrow(0, 1 + channels, channels) / total - mean * mean).clamp_min(0);
  if (running_mean.defined() && running_var.defined()) {
    at::NoGradGuard no_grad;
    const at::Tensor unbiased = variance.detach() * total / (total - 1).clamp_min(1);
    running_mean.mul_(1 - momentum).add_(mean.detach().to(running_mean.scalar_type()), momentum);
    running_var.mul_(1 - momentum).add_(unbiased.to(running_var.scalar_type()), momentum);
  }
  const at::Tensor invstd = (variance + eps).rsqrt();
  at::Tensor y = (x - mean.to(stat_type).view(per_channel)) * invstd.to(stat_type).view(per_channel);
  if (weight.defined()) y = y * weight.to(stat_type).view(per_channel);
  if (bias.defined()) y = y + bias.to(stat_type).view(per_channel);
  return y.to(input.scalar_type());
}

SyncBatchNormImpl::SyncBatchNormImpl(torch::nn::BatchNormOptions options_, std::shared_ptr<ProcessGroup> group)
    : options(std::move(options_)), group_(std::move(group)) {
  if (!group_) throw UsageError("ddp::SyncBatchNorm needs a process group (ddp::init())");
  reset();
}

void SyncBatchNormImpl::reset() {
  const std::int64_t features = options.num_features();
  if (options.affine()) {
    weight = register_parameter("weight", at::empty({features}));
    bias = register_parameter("bias", at::empty({features}));
  } else {
    weight = register_parameter("weight", at::Tensor(), /*requires_grad=*/false);
    bias = register_parameter("bias", at::Tensor(), /*requires_grad=*/false);
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", at::zeros({features}));
    running_var = register_buffer("running_var", at::ones({features}));
    num_batches_tracked = register_buffer("num_batches_tracked", at::zeros({}, at::kLong));
  } else {
    running_mean = register_buffer("running_mean", at::Tensor());
    running_var = register_buffer("running_var", at::Tensor());
    num_batches_tracked = register_buffer("num_batches_tracked", at::Tensor());
  }
  reset_parameters();
}

void SyncBatchNormImpl::reset_running_stats() {
  if (!options.track_running_stats()) return;
  at::NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (!options.affine()) return;
  at::NoGradGuard no_grad;
  weight.fill_(1);
  bias.zero_();
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "ddp::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps() << ", momentum=";
  if (options.momentum().has_value()) {
    stream << options.momentum().value();
  } else {
    stream << "None";
  }
  stream << ", affine=" << (options.affine() ? "true" : "false")
         << ", track_running_stats=" << (options.track_running_stats() ? "true" : "false") << ")";
}

at::Tensor SyncBatchNormImpl::forward(const at::Tensor& input) {
  if (input.dim() < 2 || input.size(1) != options.num_features()) {
    throw UsageError(fmt::format("ddp::SyncBatchNorm({}): input must be [N, {}, ...], got [{}]", options.num_features(),
                                 options.num_features(), fmt::join(input.sizes(), ", ")));
  }
  // torch::nn::BatchNorm's momentum: none means a cumulative average.
  double momentum = options.momentum().has_value() ? options.momentum().value() : 0.0;
  if (is_training() && options.track_running_stats()) {
    num_batches_tracked += 1;
    if (!options.momentum().has_value()) momentum = 1.0 / num_batches_tracked.item<double>();
  }
  const bool batch_statistics = is_training() || !options.track_running_stats();
  // As PyTorch's SyncBatchNorm, only training synchronises: evaluation without
  // running statistics normalises each rank's batch by its own, so that ranks
  // may evaluate different numbers of batches without waiting for each other.
  if (!is_training() || group_->world_size() == 1) {
    return at::batch_norm(input, weight, bias, running_mean, running_var, batch_statistics, momentum, options.eps(),
                          at::globalContext().userEnabledCuDNN());
  }
  // fused_batch_norm runs sync_batch_norm where its kernels do not take the input.
  return fused_batch_norm(
      input, weight, bias, running_mean, running_var, /*residual=*/{},
      FusedBatchNormOptions().momentum(momentum).eps(options.eps()).relu(false).process_group(group_));
}

}  // namespace ddp
