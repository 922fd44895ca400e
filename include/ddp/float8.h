#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/options/linear.h>
#include <torch/nn/pimpl.h>

#include <ddp/export.h>
#include <ddp/float8_tensor.h>
#include <ddp/process_group.h>
#include <ddp/rms_norm.h>

namespace ddp {

/// How the scale of an FP8 cast is chosen.
enum class Float8Scaling {
  /// From the amax of the tensor being cast, every time (Transformer Engine's
  /// Float8CurrentScaling, torchao's tensorwise recipe). Costs one reduction per cast.
  kCurrent,
  /// From a history of earlier amaxes (Transformer Engine's DelayedScaling):
  /// no reduction before the cast, and the amaxes can be agreed across ranks.
  kDelayed,
};

/// How delayed scaling turns its amax history into one amax.
enum class AmaxCompute { kMax, kMostRecent };

/// FP8 recipe of a Float8Linear. Defaults: current scaling; for delayed
/// scaling, Transformer Engine's DelayedScaling defaults.
struct Float8Options {
  /// Current (default) or delayed scaling.
  TORCH_ARG(Float8Scaling, scaling) = Float8Scaling::kCurrent;
  /// Delayed scaling: how many past amaxes are kept.
  TORCH_ARG(std::int64_t, amax_history_len) = 1024;
  /// Delayed scaling: the history's maximum, or its most recent entry.
  TORCH_ARG(AmaxCompute, amax_compute) = AmaxCompute::kMax;
  /// The scale is divided by 2^margin, leaving headroom for growing values.
  TORCH_ARG(int, margin) = 0;
  /// cuBLAS fast accumulation in the forward matmul (torchao's default).
  /// Off by default: every product is accumulated in fp32.
  TORCH_ARG(bool, fast_accumulation_forward) = false;
  /// Off, the layer computes what torch::nn::Linear does (but see fp32_weight_gradients).
  TORCH_ARG(bool, enabled) = true;
  /// With FP8 off, under CUDA autocast to bf16 or fp16, for an fp32 weight:
  /// the weight gradient leaves its GEMM in fp32 (products accumulated in
  /// fp32 and rounded once, as Megatron-LM's gradient-accumulation fusion
  /// does) instead of being rounded to the autocast dtype and converted back
  /// to fp32 as torch::nn::Linear's is, which costs a pass over every weight
  /// gradient each step. Input gradient and output are autocast's, exactly.
  /// Needs LibTorch 2.9 or newer (at::mm with an out_dtype); elsewhere, and
  /// off, the layer is exactly torch::nn::Linear.
  TORCH_ARG(bool, fp32_weight_gradients) = true;
};

class Float8LinearImpl;

namespace detail {
/// The library's access to a layer's FP8 state.
struct Float8LinearAccess;
struct Float8LinearState;
class SharedInputCast;
class OptimizerWrittenWeightCopy;
}  // namespace detail

/// A drop-in for torch::nn::Linear whose matmuls run in FP8 on sm_89+ GPUs:
/// the same constructor, parameters (`weight`, `bias`), initialisation and
/// state_dict keys. Forward multiplies E4M3 input by E4M3 weight; backward
/// multiplies the E5M2 output gradient by the E4M3 weight and input. Products
/// accumulate in fp32; the output is bf16; the weight gradient is fp32.
/// Input rows (all dimensions but the last) and both feature counts must be
/// multiples of 16.
///
/// LibTorch modules hold their children in typed members, so no function can
/// swap a `torch::nn::Linear` member for another type after construction.
/// Declare the layers that may run in FP8 as Float8Linear instead: with
/// `enabled(false)` it computes what torch::nn::Linear does (to the rounding
/// of the weight gradient under autocast: Float8Options::fp32_weight_gradients),
/// and enable_float8() switches it on.
class DDP_API Float8LinearImpl : public torch::nn::Cloneable<Float8LinearImpl> {
 public:
  /// As torch::nn::Linear(in_features, out_features), FP8 on (current scaling).
  Float8LinearImpl(std::int64_t in_features, std::int64_t out_features)
      : Float8LinearImpl(torch::nn::LinearOptions(in_features, out_features)) {}
  /// As torch::nn::Linear(options), with the FP8 recipe `float8`.
  explicit Float8LinearImpl(const torch::nn::LinearOptions& options, const Float8Options& float8 = {});
  ~Float8LinearImpl() override;

  /// Registers `weight` and `bias` and initialises them (Module::reset()).
  void reset() override;
  /// torch::nn::Linear's initialisation (Kaiming uniform weight, uniform bias).
  void reset_parameters();
  /// Prints the features, bias, and whether FP8 is on and with which scaling.
  void pretty_print(std::ostream& stream) const override;

  /// input @ weight^T + bias: in FP8 when enabled (bf16 output), else as torch::nn::Linear.
  at::Tensor forward(const at::Tensor& input);

  /// Turns FP8 on or off. On, throws UsageError where this GPU or LibTorch
  /// cannot run FP8 matmuls, or when the shape is not a multiple of 16.
  void set_float8_enabled(bool enabled);
  /// Whether the matmuls run in FP8.
  bool float8_enabled() const { return float8_options.enabled(); }

  /// The delayed-scaling state (amax histories and scales) is saved beside
  /// `weight` and `bias`, and loading accepts a plain Linear's checkpoint.
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Reads what save() wrote, or a plain torch::nn::Linear's checkpoint. A
  /// layer with FP8 off and current scaling ignores delayed-scaling state (a
  /// bf16 model reading an FP8 run's checkpoint); UsageError when the state
  /// does not fit a layer running FP8 (current scaling, another
  /// amax_history_len). Enable FP8 before loading, so that the state is kept.
  void load(torch::serialize::InputArchive& archive) override;

  /// The latest amaxes of this layer's input, weight and output gradient
  /// (delayed scaling): views of the newest entries of the amax histories,
  /// which the amaxes of the casts since the last update enter first.
  std::vector<at::Tensor> latest_amaxes();
  /// Recomputes the scales from the amax histories (after changing them,
  /// e.g. reducing them across ranks).
  void refresh_scales();

  /// The Linear options it was constructed with.
  torch::nn::LinearOptions options;
  /// The FP8 recipe.
  Float8Options float8_options;
  /// [out_features, in_features], as torch::nn::Linear's.
  at::Tensor weight;
  /// [out_features], undefined without bias.
  at::Tensor bias;

 private:
  friend struct detail::Float8LinearAccess;

  std::shared_ptr<detail::Float8LinearState> state_;
  std::shared_ptr<detail::SharedInputCast> shared_input_;
  std::shared_ptr<detail::OptimizerWrittenWeightCopy> weight_copy_;  // the bf16 copy the optimizer writes
};
/// The module holder of Float8LinearImpl, used as torch::nn::Linear is.
TORCH_MODULE(Float8Linear);

namespace float8 {

/// Which layers of a model run in FP8 after enable_float8().
struct Report {
  std::vector<std::string> converted;                        ///< module paths
  std::vector<std::pair<std::string, std::string>> skipped;  ///< module path, why
};

/// Decides by module path and layer whether a layer may run in FP8.
using Filter = std::function<bool(const std::string& path, const Float8LinearImpl& layer)>;

/// Switches FP8 on in every Float8Linear of `model` that `filter` accepts
/// (all when null) and whose features are multiples of 16, and applies
/// `options`' recipe to them. Layers left alone are reported with the
/// reason, including plain torch::nn::Linear layers, which must be declared
/// as Float8Linear to run in FP8. Throws UsageError where FP8 cannot run.
DDP_API Report enable_float8(torch::nn::Module& model, const Float8Options& options = {},
                             const Filter& filter = nullptr);

/// Lets `layers`, which are always called with the same input tensor (the
/// query, key and value projections of attention; the gate and up
/// projections of SwiGLU), cast that input to FP8 once per forward instead
/// of once each: the first of them to run on an input casts it with its own
/// scaling, the others reuse that cast while they are called with the same,
/// unmodified tensor, and cast it themselves otherwise (inference tensors are
/// always cast anew). Each layer keeps its own weight and output-gradient
/// casts. Under delayed scaling only the casting layer's input history
/// follows the tensor, so the same layer should run first in every forward
/// (as in a model's fixed call order); then the results are those of
/// separate casts; a fused norm (float8::rms_norm) writes the cast with the
/// scaling of the layer handed to it, whichever member runs first. The cast
/// is kept until every member has used it: a member that never runs (e.g.
/// left out of FP8) keeps it alive until the group's next cast. Throws
/// UsageError for layers of different input widths. A group lasts until
/// reset() of a member.
DDP_API void share_input_cast(const std::vector<Float8LinearImpl*>& layers);

/// Delayed scaling's once-per-iteration update: enters the amaxes that the
/// Float8Linear layers of `model` took in this iteration's casts into their
/// histories and recomputes the scales, in a few kernel launches for the
/// whole model. With more than one rank the amaxes are first max-reduced in
/// one all-reduce, so that every rank casts with the same scales (and a
/// layer that ran on no rank records an amax of zero, which keeps its
/// scale). Call once per iteration after backward, on one rank too: without
/// it each cast updates its own history, one small kernel per cast (on one
/// rank with the same result). Every rank must have run (or loaded) the same
/// FP8 layers before the first call, so that they reduce as many amaxes;
/// save checkpoints after the call, so that rank 0's FP8 state is every
/// rank's.
DDP_API void all_reduce_amaxes(torch::nn::Module& model, ProcessGroup& process_group);

/// down(silu(gate) * up) for a SwiGLU feed-forward whose gate and up are the
/// outputs of gate_layer and up_layer (LLaMA's w1, w3 and w2). Where the
/// three layers run in FP8 with delayed scaling on a CUDA device (and the
/// rows are a multiple of 16), one kernel computes SwiGLU in fp32 and writes
/// down's FP8 input with its transpose and amax, and backward writes the FP8
/// gradients of gate_layer's and up_layer's outputs likewise (Transformer
/// Engine's fused SwiGLU and dswiglu_cast_transpose), so that none of the
/// three tensors exists in bf16. gate and up must then come straight from
/// those layers, with no other use whose gradient is summed with this one's:
/// a layer given another gradient than the one this wrote throws UsageError.
/// Elsewhere it is down(swiglu(gate, up)), with `swiglu` (silu(gate) * up
/// in ATen ops when null).
DDP_API at::Tensor swiglu_linear(
    const at::Tensor& gate, const at::Tensor& up, Float8LinearImpl& down, Float8LinearImpl& gate_layer,
    Float8LinearImpl& up_layer,
    const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& swiglu = nullptr);

/// The same where one layer computes gate and up (LLaMA's w1 and w3 as one
/// projection, Transformer Engine's fc1 of a gated activation): gate_up
/// [..., 2 * hidden] holds gate in its first half and up in its second, and
/// in FP8 backward writes the gradient of gate_up_layer's output as one cast
/// (one scale for both halves). Elsewhere down(swiglu(gate_up)), or
/// silu(gate) * up in ATen ops when `swiglu` is null.
DDP_API at::Tensor swiglu_linear(const at::Tensor& gate_up, Float8LinearImpl& down, Float8LinearImpl& gate_up_layer,
                                 const std::function<at::Tensor(const at::Tensor&)>& swiglu = nullptr);

/// ddp::rms_norm(x, weight, options) for a norm whose output only `layer`
/// reads (a pre-norm block's norm before its attention projection), or only
/// `layer` and the layers sharing its input cast (share_input_cast: SwiGLU's
/// gate and up). Where they all run in FP8 with delayed scaling and the norm
/// would run fused on a CUDA device (with rows and features multiples of 16,
/// features up to the 7,000 or so whose FP8 rows a block's shared memory
/// holds; with a shared cast, not under inference mode and only for layers
/// held by module holders, as a model's are), the norm's kernel
/// writes `layer`'s FP8 input (data, transpose and amax) itself, as
/// Transformer Engine's LayerNormLinear and LayerNormMLP do, and returns, in
/// place of the values, a tensor of the norm's shape and dtype that holds
/// none: hand it to `layer` (and once to each layer sharing its cast, in any
/// order), and to nothing else (the layer throws UsageError for any other
/// tensor while the cast waits). Backward is the fused norm's. Elsewhere
/// exactly ddp::rms_norm.
DDP_API at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, Float8LinearImpl& layer,
                            const RMSNormOptions& options = {});

/// ddp::add_rms_norm(x, delta, weight, options) likewise: h = x + delta is
/// returned as ever, the norm of h as `layer`'s FP8 input where it can be.
DDP_API std::pair<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& delta,
                                                       const at::Tensor& weight, Float8LinearImpl& layer,
                                                       const RMSNormOptions& options = {});

/// The same with the residual branch's last layer as well: `delta` is the
/// output of `delta_layer` (attention's output projection, the feed-forward's
/// down projection), handed here unchanged and read by nothing else. Where
/// `delta_layer` runs FP8 with delayed scaling and the norm runs fused, with
/// rows and features multiples of 16, backward writes delta's gradient as
/// that layer's FP8 output gradient (E5M2 data, transpose and amax) and hands
/// autograd, in place of the values, a tensor that holds none, which only
/// `delta_layer` takes (its backward throws UsageError for anything else).
/// Either layer may be null: nothing is fused on its side.
DDP_API std::pair<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& delta,
                                                       Float8LinearImpl* delta_layer, const at::Tensor& weight,
                                                       Float8LinearImpl* layer, const RMSNormOptions& options = {});

/// For a kernel of one's own that computes the gradient of `layer`'s output
/// (the backward of the one op that reads that output, unchanged, as LLaMA's
/// q/k/v split and rotation after its one projection): where the layer's
/// backward would cast that gradient to FP8 with delayed scaling (FP8 on,
/// no bias, a forward run; the gradient [rows, cols] with rows a multiple of
/// 16 and cols = out_features, a multiple of 16), the cast to write in its place,
/// as swiglu_linear's and add_rms_norm's backward do: `data` [rows, cols] in
/// the gradient's FP8 dtype (E5M2), to hold round(g * scale) saturated to
/// the format's largest finite value, where g is each gradient value as the
/// kernel would have stored it (in bf16, say) and `scale` the 0-dim fp32
/// scale on the device; `amax`, 0-dim fp32, to max-accumulate |g| into (an
/// atomicMax on the bits of non-negative floats does). nullopt elsewhere:
/// write the gradient in values. After the kernel, hand autograd what
/// output_gradient_written() returns.
DDP_API std::optional<Float8Tensor> output_gradient_destination(Float8LinearImpl& layer, std::int64_t rows,
                                                                std::int64_t cols);

/// After a kernel wrote `cast.data` and its amax (output_gradient_destination
/// gave `cast` for `layer`, and nothing cast that layer's output gradient
/// since): completes the cast (its transpose and inverse scale, on the
/// current stream) and returns the tensor to hand autograd as the gradient
/// of the layer's output, of `sizes` (the output's shape: [..., cols] with
/// rows elements before the last) and `dtype`, holding no values: a hook on
/// that output sees no gradient values. Only the layer's backward takes it;
/// given any other tensor, the layer throws UsageError. UsageError for a
/// cast given for another layer or a shape that does not match it.
DDP_API at::Tensor output_gradient_written(Float8LinearImpl& layer, const Float8Tensor& cast, at::IntArrayRef sizes,
                                           c10::ScalarType dtype);

}  // namespace float8
}  // namespace ddp
