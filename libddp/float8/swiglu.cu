// SwiGLU written straight into FP8: the arithmetic of swiglu_linear's fused
// forward and backward, as functors of the cast kernel's tile template.

#include "float8/kernels.h"
#include "float8/tile.cuh"

namespace ddp::detail {
namespace {

// The fast exponential and division (errors of a few ulp: __expf's grows
// with |x|, 2 + 1.2|x| ulp, still far inside FP8's 2- or 3-bit mantissa)
// where expf and the IEEE division cost the kernel more issue slots than its
// memory traffic leaves it. For gate -> -inf, 1 + e^-gate is inf and
// __fdividef gives 0, as the exact sigmoid's limit.
__device__ __forceinline__ float sigmoid(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }

/// (gate, up) -> silu(gate) * up.
struct SwigluToFloat8 {
  __device__ __forceinline__ void operator()(const float (&x)[2], float (&y)[1]) const {
    y[0] = x[0] * sigmoid(x[0]) * x[1];
  }
};

/// (grad_y, gate, up) -> (grad_gate, grad_up):
///   d/d gate = grad_y * up * sigmoid(gate) * (1 + gate * (1 - sigmoid(gate)))
///   d/d up   = grad_y * silu(gate)
struct SwigluGradientsToFloat8 {
  __device__ __forceinline__ void operator()(const float (&x)[3], float (&y)[2]) const {
    const float grad = x[0], gate = x[1], up = x[2];
    const float s = sigmoid(gate);
    y[0] = grad * up * s * (1.0f + gate * (1.0f - s));
    y[1] = grad * gate * s;
  }
};

}  // namespace

void swiglu_to_float8(const at::Tensor& gate, const at::Tensor& up, Float8Tensor& y) {
  float8_tiles::launch_float8_tiles<2, 1>("swiglu_to_float8: ", {gate, up}, {&y}, SwigluToFloat8{});
}

void swiglu_gradients_to_float8(const at::Tensor& grad_y, const at::Tensor& gate, const at::Tensor& up,
                                Float8Tensor& grad_gate, Float8Tensor& grad_up) {
  float8_tiles::launch_float8_tiles<3, 2>("swiglu_gradients_to_float8: ", {grad_y, gate, up}, {&grad_gate, &grad_up},
                                          SwigluGradientsToFloat8{});
}

}  // namespace ddp::detail
