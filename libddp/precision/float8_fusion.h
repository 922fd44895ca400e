#pragma once

// FP8 casts written where the tensor is computed. A Float8Linear casts its
// input in forward and its output gradient in backward: one pass that reads
// the bf16 tensor another kernel has just written. A kernel that computes
// such a tensor elementwise (SwiGLU forward, for the layer after it; SwiGLU
// backward, for the gradients of the layers before it) can instead write the
// FP8 cast itself (float8_tile.cuh), so that the bf16 tensor is neither
// written nor read: Transformer Engine's fused LayerNormLinear and
// LayerNormMLP do the same for their norms' outputs.
//
// The protocol, for a layer whose scaling is `scaling`:
//   Float8Destination d = scaling->destination(rows, cols);
//   ... the kernel writes d.outputs with d.scale and d.largest ...
//   at::Tensor handle = scaling->offer(d, sizes, dtype);
// and `handle` goes to the layer where the tensor would have: as its input,
// or returned from backward as the gradient of its output. The layer takes
// the offered cast instead of casting; anything else given to it instead is
// an error. Delayed scaling only: current scaling needs the tensor's amax
// before the cast, which a kernel that computes the tensor does not know.

#include <c10/core/Device.h>

#include "precision/float8_scaling.h"

namespace ddp::detail {

/// The scaling of `layer`'s input, for a kernel on `device` that writes its
/// cast: null unless the layer runs in FP8 with delayed scaling. Makes the
/// layer's FP8 state where its first forward has not yet.
TensorScaling* fusable_input_scaling(Float8LinearImpl& layer, const c10::Device& device);

/// The scaling of the gradient of `layer`'s output, likewise: null unless
/// the layer runs in FP8 with delayed scaling and has run a forward. The
/// pointer is the layer's: copy it (copies share the state) to keep it for
/// backward.
TensorScaling* fusable_grad_output_scaling(Float8LinearImpl& layer);

}  // namespace ddp::detail
