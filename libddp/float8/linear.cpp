#include <ddp/float8.h>

#include <cmath>
#include <optional>
#include <ostream>
#include <string>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>
#include <torch/serialize/archive.h>

#include <ddp/errors.h>

#include "compat/torch_compat.h"
#include "float8/input_sharing.h"
#include "float8/linear_state.h"
#include "float8/scaling.h"
#include "float8/support.h"
#ifdef DDP_WITH_CUDA_KERNELS
#include "float8/weight_cast.h"
#include "optim/weight_casts.h"
#endif

namespace ddp {
namespace detail {

/// check_device: whether `device` must be able to run FP8 now; a state
/// loaded from a checkpoint on the CPU is checked when it meets its GPU.
std::shared_ptr<Float8LinearState> make_float8_state(const Float8Options& options, const c10::Device& device,
                                                     bool check_device = true) {
#if DDP_TORCH_HAS_SCALED_MM
  if (check_device) check_float8_supported(device);
  auto state = std::make_shared<Float8LinearState>();
  state->input = TensorScaling(options, at::kFloat8_e4m3fn, device);
  state->weight = TensorScaling(options, at::kFloat8_e4m3fn, device);
  state->grad_output = TensorScaling(options, at::kFloat8_e5m2, device);
  state->device = device;
#ifdef DDP_WITH_CUDA_KERNELS
  if (state->weight.delayed()) state->weight_cast = std::make_shared<OptimizerWrittenWeightCast>(state->weight);
#endif
  return state;
#else
  (void)options;
  (void)check_device;
  check_float8_supported(device);  // throws: this LibTorch has no FP8 matmul
  return nullptr;
#endif
}

namespace {

#if DDP_TORCH_HAS_SCALED_MM
/// A layer's product [M, N] seen in the shape of its input [..., K]: [..., N].
at::Tensor in_input_shape(const at::Tensor& product, const at::Tensor& input) {
  std::vector<int64_t> sizes = input.sizes().vec();
  sizes.back() = product.size(1);
  return product.view(sizes);
}

/// a [M, K] row-major times b [K, N] column-major (b.t() contiguous); the
/// scales are the inverse ones, which turn the FP8 values back into reals.
at::Tensor scaled_mm(const at::Tensor& a, const at::Tensor& a_inverse_scale, const at::Tensor& b,
                     const at::Tensor& b_inverse_scale, c10::ScalarType out_dtype, bool fast_accumulation) {
  return at::_scaled_mm(a, b, a_inverse_scale, b_inverse_scale, c10::nullopt, c10::nullopt, out_dtype,
                        fast_accumulation);
}

/// x [..., K] as the matrix [M, K]: data row-major is y's first operand;
/// transposed [K, M] is x column-major, the second operand of dW = dY^T x.
/// The cast a fused kernel wrote for `input` (TensorScaling::offer), or the
/// one the layer shares with others, or its own.
Float8Tensor cast_input(const at::Tensor& input, Float8LinearState* state, SharedInputCast* shared_input,
                        bool with_transposed) {
  if (std::optional<Float8Tensor> offered = state->input.take_offered(input, "input")) return *std::move(offered);
  if (shared_input != nullptr) return shared_input->cast(state, input, state->input, with_transposed);
  return state->input.cast(input.reshape({-1, input.size(-1)}).contiguous(), with_transposed);
}

/// dY [..., N] as the matrix [M, N]: data row-major is the first operand of
/// dX = dY W; transposed [N, M] is dY^T row-major, the first operand of
/// dW = dY^T x. The cast a fused kernel wrote for it, or the layer's own.
Float8Tensor cast_grad_output(const at::Tensor& grad_output, TensorScaling& scaling, int64_t out_features,
                              bool with_transposed, bool with_data) {
  if (std::optional<Float8Tensor> offered = scaling.take_offered(grad_output, "output gradient")) {
    return *std::move(offered);
  }
  return scaling.cast(grad_output.reshape({-1, out_features}).contiguous(), with_transposed, with_data);
}

/// W [N, K]: the cast the fused optimizer wrote as it last updated W, or the
/// layer's own; data.t() [K, N] is W^T column-major, y's second operand;
/// transposed [K, N] is W column-major, the second operand of dX = dY W.
Float8Tensor cast_weight(const at::Tensor& weight, Float8LinearState* state, bool with_transposed) {
#ifdef DDP_WITH_CUDA_KERNELS
  if (state->weight_cast) {
    if (std::optional<Float8Tensor> written = state->weight_cast->take(weight)) return *std::move(written);
    // None waits: asks the optimizer (FusedAdamW) to write the next one.
    set_weight_cast_target(weight, state->weight_cast);
  }
#endif
  return state->weight.cast(weight, with_transposed);
}

/// y = x W^T with x and W in E4M3; backward with the output gradient in
/// E5M2. The bias is added outside, by ordinary autograd: custom functions
/// take no undefined inputs, and LLaMA-style layers have none.
///
/// at::_scaled_mm reads its second operand column-major, and each cast
/// matrix is a second operand once: so every cast writes its transpose in
/// the same pass, and no GEMM operand is transposed on its own. Backward
/// keeps only the transposes of x and W (as FP8, not the fp32/bf16
/// originals: a quarter to a half of the memory, as Transformer Engine
/// does), and only those its gradients read.
struct Float8LinearFunction : public torch::autograd::Function<Float8LinearFunction> {
  /// input_needs_grad / weight_needs_grad: whether backward will compute
  /// that gradient (grad mode is off in here, so the caller says).
  static at::Tensor forward(torch::autograd::AutogradContext* context, const at::Tensor& input,
                            const at::Tensor& weight, Float8LinearState* state, SharedInputCast* shared_input,
                            bool fast_accumulation, bool input_needs_grad, bool weight_needs_grad) {
    const Float8Tensor input8 = cast_input(input, state, shared_input, /*with_transposed=*/weight_needs_grad);
    const Float8Tensor weight8 = cast_weight(weight, state, /*with_transposed=*/input_needs_grad);
    // y = x W^T: [M, K] x [K, N].
    const at::Tensor output = scaled_mm(input8.data, input8.inverse_scale, weight8.data.t(), weight8.inverse_scale,
                                        at::kBFloat16, fast_accumulation);

    // Undefined where that gradient is not needed.
    context->save_for_backward({input8.transposed, input8.inverse_scale, weight8.transposed, weight8.inverse_scale});
    state->grad_output.save_to(context, "grad_output.");
    context->saved_data["input_sizes"] = input.sizes().vec();
    context->saved_data["input_dtype"] = static_cast<int64_t>(input.scalar_type());
    context->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    context->saved_data["out_features"] = weight.size(0);

    return in_input_shape(output, input);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = context->get_saved_variables();
    const at::Tensor& input_t = saved[0];  // x^T [K, M] row-major, or undefined
    const at::Tensor& input_inverse_scale = saved[1];
    const at::Tensor& weight_t = saved[2];  // W^T [K, N] row-major, or undefined
    const at::Tensor& weight_inverse_scale = saved[3];
    const auto input_sizes = context->saved_data["input_sizes"].toIntVector();
    const auto input_dtype = static_cast<c10::ScalarType>(context->saved_data["input_dtype"].toInt());
    const auto weight_dtype = static_cast<c10::ScalarType>(context->saved_data["weight_dtype"].toInt());
    const int64_t out_features = context->saved_data["out_features"].toInt();

    TensorScaling grad_scaling = TensorScaling::load_from(context, "grad_output.");
    const Float8Tensor grad8 =
        cast_grad_output(grad_outputs[0], grad_scaling, out_features,
                         /*with_transposed=*/input_t.defined(), /*with_data=*/weight_t.defined());

    at::Tensor grad_input;
    if (weight_t.defined()) {
      // dX = dY W: [M, N] x [N, K], W column-major being W^T row-major.
      grad_input = scaled_mm(grad8.data, grad8.inverse_scale, weight_t.t(), weight_inverse_scale, input_dtype,
                             /*fast_accumulation=*/false)
                       .view(input_sizes);
    }
    at::Tensor grad_weight;
    if (input_t.defined()) {
      // dW = dY^T x: [N, M] x [M, K], accumulated in fp32 and returned in the weight's dtype.
      grad_weight = scaled_mm(grad8.transposed, grad8.inverse_scale, input_t.t(), input_inverse_scale, weight_dtype,
                              /*fast_accumulation=*/false);
    }
    return {grad_input, grad_weight, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};
#endif

#if DDP_TORCH_HAS_MM_OUT_DTYPE
/// W in `dtype`: the bf16 copy the fused optimizer wrote as it last updated
/// W (the same bytes), or W converted here.
at::Tensor cast_weight_to(const at::Tensor& weight, c10::ScalarType dtype,
                          [[maybe_unused]] const std::shared_ptr<OptimizerWrittenWeightCopy>& weight_copy) {
#ifdef DDP_WITH_CUDA_KERNELS
  if (weight_copy && dtype == at::kBFloat16) {
    if (std::optional<at::Tensor> written = weight_copy->take(weight)) return *std::move(written);
    // None written for W as it is: asks the optimizer (FusedAdamW) to write the next one.
    set_weight_cast_target(weight, weight_copy);
  }
#endif
  return weight.to(dtype);
}

/// y = x W^T + b as CUDA autocast computes it (x, W and b rounded to the
/// autocast dtype, products accumulated in fp32, y rounded), except for the
/// weight and bias gradients, which leave their GEMM and sum in fp32: under
/// autocast, torch::nn::Linear's weight gradient is rounded to the autocast
/// dtype and then converted to the fp32 parameter's dtype (autocast's cast
/// of W being differentiated), a pass over every weight gradient in ATen's
/// copy kernel, 4.4 ms of a LLaMA-1.1B bf16 step's 127 ms on an H200
/// (profile of 2026-11-26). `bias` is empty or the bias: a custom function
/// takes no undefined tensors.
struct AutocastLinearFunction : public torch::autograd::Function<AutocastLinearFunction> {
  /// input_needs_grad / weight_needs_grad: whether backward will compute
  /// that gradient (grad mode is off in here, so the caller says).
  /// weight_copy: the layer's bf16 copy written by the optimizer, or null.
  static at::Tensor forward(torch::autograd::AutogradContext* context, const at::Tensor& input,
                            const at::Tensor& weight, at::TensorList bias, c10::ScalarType compute_dtype,
                            std::shared_ptr<OptimizerWrittenWeightCopy> weight_copy, bool input_needs_grad,
                            bool weight_needs_grad) {
    const int64_t in_features = weight.size(1);
    const at::Tensor rows = input.to(compute_dtype).reshape({-1, in_features});
    const at::Tensor weight_cast = cast_weight_to(weight, compute_dtype, weight_copy);
    const at::Tensor output =
        bias.empty() ? at::mm(rows, weight_cast.t()) : at::addmm(bias[0].to(compute_dtype), rows, weight_cast.t());
    context->save_for_backward(
        {weight_needs_grad ? rows : at::Tensor(), input_needs_grad ? weight_cast : at::Tensor()});
    context->saved_data["input_sizes"] = input.sizes().vec();
    context->saved_data["input_dtype"] = static_cast<int64_t>(input.scalar_type());
    context->saved_data["with_bias"] = !bias.empty();

    return in_input_shape(output, input);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = context->get_saved_variables();
    const at::Tensor& rows = saved[0];         // x [M, K] in the compute dtype, or undefined
    const at::Tensor& weight_cast = saved[1];  // W [N, K] in the compute dtype, or undefined
    const auto input_sizes = context->saved_data["input_sizes"].toIntVector();
    const auto input_dtype = static_cast<c10::ScalarType>(context->saved_data["input_dtype"].toInt());
    const bool with_bias = context->saved_data["with_bias"].toBool();
    const at::Tensor& grad = grad_outputs[0];
    const at::Tensor grad_rows = grad.reshape({-1, grad.size(-1)});

    at::Tensor grad_input, grad_weight, grad_bias;
    // dX = dY W, rounded to the compute dtype and converted to x's, as autocast's.
    if (weight_cast.defined()) grad_input = at::mm(grad_rows, weight_cast).view(input_sizes).to(input_dtype);
    // dW = dY^T x, accumulated and written in fp32.
    if (rows.defined()) grad_weight = at::mm(grad_rows.t(), rows, at::kFloat);
    if (with_bias) grad_bias = grad_rows.sum(0, /*keepdim=*/false, at::kFloat);
    torch::autograd::variable_list grads{grad_input, grad_weight};
    if (with_bias) grads.push_back(grad_bias);
    grads.resize(grads.size() + 4);  // compute_dtype, weight_copy, input_needs_grad, weight_needs_grad
    return grads;
  }
};

/// Whether `layer`'s weight gradient leaves its GEMM in fp32
/// (Float8Options::fp32_weight_gradients): CUDA autocast to a 16-bit dtype,
/// an fp32 weight that needs a gradient, an input autocast would cast (not
/// fp64).
bool computes_fp32_weight_gradients(const Float8LinearImpl& layer, const at::Tensor& input) {
  if (!layer.float8_options.fp32_weight_gradients() || !input.is_cuda() || !layer.weight.is_cuda() ||
      layer.weight.scalar_type() != at::kFloat || !layer.weight.requires_grad() || !at::GradMode::is_enabled() ||
      !compat::autocast_enabled(c10::DeviceType::CUDA)) {
    return false;
  }
  const c10::ScalarType dtype = compat::autocast_dtype(c10::DeviceType::CUDA);
  const c10::ScalarType input_dtype = input.scalar_type();
  return (dtype == at::kBFloat16 || dtype == at::kHalf) &&
         (input_dtype == at::kFloat || input_dtype == at::kBFloat16 || input_dtype == at::kHalf) &&
         (!layer.bias.defined() || layer.bias.scalar_type() == at::kFloat);
}
#endif

}  // namespace
}  // namespace detail

Float8LinearImpl::Float8LinearImpl(const torch::nn::LinearOptions& options, const Float8Options& float8)
    : options(options), float8_options(float8) {
  reset();
}

Float8LinearImpl::~Float8LinearImpl() = default;

void Float8LinearImpl::reset() {
  weight = register_parameter("weight", torch::empty({options.out_features(), options.in_features()}));
  if (options.bias()) {
    bias = register_parameter("bias", torch::empty(options.out_features()));
  } else {
    bias = register_parameter("bias", {}, /*requires_grad=*/false);
  }
  reset_parameters();
  state_.reset();
  shared_input_.reset();
  weight_copy_.reset();
}

void Float8LinearImpl::reset_parameters() {
  // torch::nn::Linear's initialisation, in the same order of random draws, so
  // the same seed gives the same weights as a Linear.
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5));
  if (bias.defined()) {
    const auto [fan_in, fan_out] = torch::nn::init::_calculate_fan_in_and_fan_out(weight);
    (void)fan_out;
    const double bound = 1 / std::sqrt(static_cast<double>(fan_in));
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

void Float8LinearImpl::pretty_print(std::ostream& stream) const {
  stream << "ddp::Float8Linear(in_features=" << options.in_features() << ", out_features=" << options.out_features()
         << ", bias=" << (options.bias() ? "true" : "false") << ", float8=" << (float8_enabled() ? "on" : "off")
         << ", scaling=" << (float8_options.scaling() == Float8Scaling::kDelayed ? "delayed" : "current") << ")";
}

void Float8LinearImpl::set_float8_enabled(bool enabled) {
  if (enabled) {
    for (const int64_t features : {options.in_features(), options.out_features()}) {
      if (features % 16 != 0) {
        throw UsageError(
            fmt::format("Float8Linear({}, {}): FP8 matmuls need feature counts that are multiples of "
                        "16; keep this layer in bf16",
                        options.in_features(), options.out_features()));
      }
    }
  }
  if (enabled != float8_options.enabled()) state_.reset();
  float8_options.enabled(enabled);
}

at::Tensor Float8LinearImpl::forward(const at::Tensor& input) {
  if (!float8_enabled()) {
#if DDP_TORCH_HAS_MM_OUT_DTYPE
    if (detail::computes_fp32_weight_gradients(*this, input)) {
      const std::vector<at::Tensor> bias_list =
          bias.defined() ? std::vector<at::Tensor>{bias} : std::vector<at::Tensor>{};
#ifdef DDP_WITH_CUDA_KERNELS
      if (!weight_copy_) weight_copy_ = std::make_shared<detail::OptimizerWrittenWeightCopy>();
#endif
      return detail::AutocastLinearFunction::apply(input, weight, at::TensorList(bias_list),
                                                   compat::autocast_dtype(c10::DeviceType::CUDA), weight_copy_,
                                                   input.requires_grad(), weight.requires_grad());
    }
#endif
    return torch::nn::functional::linear(input, weight, bias);
  }
#if DDP_TORCH_HAS_SCALED_MM
  detail::Float8LinearAccess::state_on(*this, input.device());
  const int64_t rows = input.numel() / std::max<int64_t>(1, options.in_features());
  if (input.size(-1) != options.in_features() || rows % 16 != 0) {
    throw UsageError(fmt::format(
        "Float8Linear({}, {}): input of shape {} does not fit: the last dimension must be "
        "{} and the rows ({}) a multiple of 16 for FP8 matmuls; pad the batch or keep this "
        "layer in bf16",
        options.in_features(), options.out_features(), c10::str(input.sizes()), options.in_features(), rows));
  }
  if (rows == 0) {
    // Nothing to cast or multiply, and at::_scaled_mm is not asked to take
    // empty operands: an empty bf16 output, as the FP8 path's, and zero
    // gradients through ordinary autograd.
    return torch::nn::functional::linear(input.to(at::kBFloat16), weight.to(at::kBFloat16),
                                         bias.defined() ? bias.to(at::kBFloat16) : at::Tensor());
  }
  // Decided here: inside the function grad mode is off.
  const bool grad = at::GradMode::is_enabled();
  const at::Tensor output = detail::Float8LinearFunction::apply(
      input, weight, state_.get(), shared_input_.get(), float8_options.fast_accumulation_forward(),
      grad && input.requires_grad(), grad && weight.requires_grad());
  return bias.defined() ? output + bias.to(output.scalar_type()) : output;
#else
  detail::check_float8_supported(input.device());  // throws: this LibTorch has no FP8 matmul
  return {};
#endif
}

namespace detail {

Float8LinearState* Float8LinearAccess::state(Float8LinearImpl& layer) { return layer.state_.get(); }

Float8LinearState* Float8LinearAccess::state_on(Float8LinearImpl& layer, const c10::Device& device) {
  if (!layer.float8_enabled()) return nullptr;
  if (!layer.state_) {
    layer.state_ = make_float8_state(layer.float8_options, device);
  } else if (layer.state_->device != device) {
    check_float8_supported(device);
    layer.state_->to(device);
  }
  return layer.state_.get();
}

std::shared_ptr<SharedInputCast>& Float8LinearAccess::shared_input(Float8LinearImpl& layer) {
  return layer.shared_input_;
}

TensorScaling* Float8LinearAccess::fusable_input_scaling(Float8LinearImpl& layer, const c10::Device& device) {
  Float8LinearState* layer_state = state_on(layer, device);
  return layer_state != nullptr && layer_state->input.delayed() ? &layer_state->input : nullptr;
}

TensorScaling* Float8LinearAccess::fusable_grad_output_scaling(Float8LinearImpl& layer) {
  Float8LinearState* layer_state = state(layer);
  // FP8 on, not just state: a layer with FP8 off can hold state (loaded
  // from an FP8 checkpoint) and would hand the placeholder to its bf16 matmul.
  return layer_state != nullptr && layer.float8_enabled() && layer_state->grad_output.delayed() && !layer.bias.defined()
             ? &layer_state->grad_output
             : nullptr;
}

bool Float8LinearAccess::save_scaling(const Float8LinearImpl& layer, torch::serialize::OutputArchive& scaling) {
  if (!layer.state_ || !layer.state_->input.delayed()) return false;
  const auto host = [](const at::Tensor& t) { return t.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true); };
  for (auto [role, tensor_scaling] : layer.state_->named_scalings()) {
    TensorScaling committed = tensor_scaling->with_copied_state();
    committed.commit_pending_amax();
    scaling.write(std::string(role) + ".amax_history", host(committed.amax_history()), /*is_buffer=*/true);
    scaling.write(std::string(role) + ".scale", host(committed.scale()), /*is_buffer=*/true);
  }
  return true;
}

bool Float8LinearAccess::check_scaling(const Float8LinearImpl& layer, const std::string& name,
                                       torch::serialize::InputArchive& scaling) {
  const std::string who = name.empty() ? "Float8Linear" : fmt::format("Float8Linear '{}'", name);
  if (layer.float8_options.scaling() != Float8Scaling::kDelayed) {
    if (!layer.float8_enabled()) return false;
    throw UsageError(fmt::format(
        "{}: the checkpoint holds delayed-scaling state but this layer uses current scaling; construct it with "
        "Float8Options().scaling(ddp::Float8Scaling::kDelayed)",
        who));
  }
#if !DDP_TORCH_HAS_SCALED_MM
  if (!layer.float8_enabled()) return false;  // this LibTorch runs no FP8: nothing to restore the state for
#endif
  const std::int64_t length = layer.float8_options.amax_history_len();
  for (const char* role : Float8LinearState::kRoles) {
    at::Tensor history;
    at::Tensor scale;
    if (!scaling.try_read(std::string(role) + ".amax_history", history, /*is_buffer=*/true) ||
        !scaling.try_read(std::string(role) + ".scale", scale, /*is_buffer=*/true)) {
      throw UsageError(
          fmt::format("{}: the checkpoint's FP8 scaling state has no {} amax history or scale; it is "
                      "damaged or not libddp's",
                      who, role));
    }
    if (history.dim() != 1 || history.numel() != length) {
      throw UsageError(fmt::format(
          "{}: the checkpoint's amax history has {} entries, this layer's {}; use the same amax_history_len", who,
          history.numel(), length));
    }
    if (history.scalar_type() != at::kFloat || scale.scalar_type() != at::kFloat || scale.numel() != 1) {
      throw UsageError(
          fmt::format("{}: the checkpoint's {} scaling state is not an fp32 history and one fp32 scale; "
                      "it is damaged or not libddp's",
                      who, role));
    }
  }
  return true;
}

void Float8LinearAccess::load_scaling(Float8LinearImpl& layer, const std::string& name,
                                      torch::serialize::InputArchive& scaling) {
  if (!check_scaling(layer, name, scaling)) return;
  if (!layer.state_) {
    layer.state_ = make_float8_state(layer.float8_options, layer.weight.device(), /*check_device=*/false);
  }
  for (auto [role, tensor_scaling] : layer.state_->named_scalings()) {
    at::Tensor history;
    at::Tensor scale;
    scaling.read(std::string(role) + ".amax_history", history, /*is_buffer=*/true);
    scaling.read(std::string(role) + ".scale", scale, /*is_buffer=*/true);
    tensor_scaling->commit_pending_amax();  // so that no amax from before the load enters the loaded history
    tensor_scaling->amax_history().copy_(history);
    tensor_scaling->scale().copy_(scale);
  }
}

}  // namespace detail

std::vector<at::Tensor> Float8LinearImpl::latest_amaxes() {
  if (!state_ || !state_->input.delayed()) return {};
  return {state_->input.latest_amax(), state_->weight.latest_amax(), state_->grad_output.latest_amax()};
}

void Float8LinearImpl::refresh_scales() {
  if (!state_) return;
  state_->input.refresh_scale();
  state_->weight.refresh_scale();
  state_->grad_output.refresh_scale();
}

void Float8LinearImpl::save(torch::serialize::OutputArchive& archive) const {
  torch::nn::Module::save(archive);
  // Beside weight and bias, not among the buffers, so that the parameters
  // and their keys stay those of torch::nn::Linear.
  torch::serialize::OutputArchive scaling(archive.compilation_unit());
  if (detail::Float8LinearAccess::save_scaling(*this, scaling)) {
    archive.write(detail::Float8LinearAccess::kScalingKey, scaling);
  }
}

void Float8LinearImpl::load(torch::serialize::InputArchive& archive) {
  torch::serialize::InputArchive scaling;
  // A plain Linear's checkpoint has none. Checked before the weights are written: a refused load changes nothing.
  const bool has_scaling = archive.try_read(detail::Float8LinearAccess::kScalingKey, scaling);
  if (has_scaling) detail::Float8LinearAccess::check_scaling(*this, "", scaling);
  torch::nn::Module::load(archive);
  if (has_scaling) detail::Float8LinearAccess::load_scaling(*this, "", scaling);
}

}  // namespace ddp
