#pragma once

// What a Float8Linear keeps besides its parameters, and the library's one way
// in to it (the layer declares Float8LinearAccess its friend).

#include <array>
#include <memory>
#include <string>
#include <utility>

#include <c10/core/Device.h>

#include <ddp/float8.h>

#include "float8/scaling.h"

namespace torch::serialize {
class InputArchive;
class OutputArchive;
}  // namespace torch::serialize

namespace ddp::detail {

class OptimizerWrittenWeightCast;

/// The scaling of the three tensors a Float8Linear casts, and the device it
/// was checked to run FP8 on.
struct Float8LinearState {
  TensorScaling input;
  TensorScaling weight;
  TensorScaling grad_output;
  c10::Device device{c10::kCPU};
  /// Delayed scaling with libddp's CUDA kernels: the weight's cast the fused
  /// optimizer writes (float8/weight_cast.h); null otherwise.
  std::shared_ptr<OptimizerWrittenWeightCast> weight_cast;

  /// The roles' names, the keys of their checkpoint entries.
  static constexpr std::array<const char*, 3> kRoles{"input", "weight", "grad_output"};

  std::array<TensorScaling*, 3> scalings() { return {&input, &weight, &grad_output}; }
  /// The same with their roles' names.
  std::array<std::pair<const char*, TensorScaling*>, 3> named_scalings() {
    return {{{kRoles[0], &input}, {kRoles[1], &weight}, {kRoles[2], &grad_output}}};
  }

  void to(const c10::Device& target) {
    for (TensorScaling* scaling : scalings()) scaling->to(target);
    device = target;
  }
};

struct Float8LinearAccess {
  /// The layer's FP8 state; null while FP8 is off or before its first forward.
  static Float8LinearState* state(Float8LinearImpl& layer);
  /// The layer's FP8 state on `device`, made or moved there as a forward on
  /// that device would; null while FP8 is off.
  static Float8LinearState* state_on(Float8LinearImpl& layer, const c10::Device& device);
  /// The input cast the layer shares with others (float8::share_input_cast), or null.
  static std::shared_ptr<SharedInputCast>& shared_input(Float8LinearImpl& layer);

  // A kernel that computes a layer's input, or the gradient of its output,
  // can write that tensor's FP8 cast itself (TensorScaling::destination and
  // offer): then neither the bf16 tensor nor a cast's second pass over it
  // exists. Only under delayed scaling: current scaling needs the tensor's
  // amax before the cast, which a kernel that computes the tensor does not
  // know. Transformer Engine's fused LayerNormLinear and LayerNormMLP do the
  // same for their norms' outputs.

  /// The scaling of `layer`'s input, for a kernel on `device` that writes its
  /// cast: null unless the layer runs in FP8 with delayed scaling. Makes the
  /// layer's FP8 state where its first forward has not yet.
  static TensorScaling* fusable_input_scaling(Float8LinearImpl& layer, const c10::Device& device);
  /// The scaling of the gradient of `layer`'s output, likewise: null unless
  /// the layer runs in FP8 with delayed scaling (FP8 on), has run a forward, and has
  /// no bias (the bias's add would hand the placeholder of an offered
  /// gradient to the bias gradient's sum as well as to the layer). The
  /// pointer is the layer's: copy it (copies share the state) to keep it for
  /// backward.
  static TensorScaling* fusable_grad_output_scaling(Float8LinearImpl& layer);

  // The delayed-scaling state in a checkpoint: the same archive, under the
  // key kScalingKey beside the layer's parameters, whether the layer saves
  // itself (Module::save) or a checkpoint writes the module's tensors for it
  // (DDP's sharded save_module, the sharded format's manifest).
  static constexpr const char* kScalingKey = "float8_scaling";

  /// Writes host copies of the layer's amax histories and scales into
  /// `scaling`, with a pending amax entered as the next commit would enter
  /// it, but without committing it: saving runs on rank 0 alone, and a
  /// commit there would put its histories out of step with the other ranks'.
  /// False, and nothing written, unless the layer has delayed-scaling state.
  static bool save_scaling(const Float8LinearImpl& layer, torch::serialize::OutputArchive& scaling);
  /// Whether what save_scaling() wrote is for `layer` to load: UsageError
  /// naming `name` when it does not fit a layer running FP8 (current
  /// scaling, another amax_history_len); false when the layer has no use for
  /// it (FP8 off and current scaling: a bf16 model reading an FP8 run's
  /// checkpoint). Changes nothing, so that a load can check before it writes.
  static bool check_scaling(const Float8LinearImpl& layer, const std::string& name,
                            torch::serialize::InputArchive& scaling);
  /// Loads what save_scaling() wrote (after check_scaling()), making the
  /// state where the layer has none yet.
  static void load_scaling(Float8LinearImpl& layer, const std::string& name, torch::serialize::InputArchive& scaling);
};

}  // namespace ddp::detail
