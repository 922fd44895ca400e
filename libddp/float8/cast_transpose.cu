#include "float8/kernels.h"
#include "float8/tile.cuh"

namespace ddp {
namespace {

/// The plain cast: each output value is its input value.
struct Identity {
  __device__ __forceinline__ void operator()(const float (&x)[1], float (&y)[1]) const { y[0] = x[0]; }
};

}  // namespace

void float8::cast_transpose(const at::Tensor& input, Float8Tensor& output) {
  detail::float8_tiles::launch_float8_tiles<1, 1>("ddp::float8::cast_transpose: ", {input}, {&output}, Identity{});
}

}  // namespace ddp
