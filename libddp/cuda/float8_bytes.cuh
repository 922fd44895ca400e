#pragma once

// The bytes of FP8 values as the kernels that write FP8 tensors handle them:
// four values packed in a word, 4 x 4 blocks of bytes transposed in
// registers, |x| as integer bits for the amax. The FP8 cast kernels
// (float8/tile.cuh), the norm that writes FP8 (float8/rms_norm.cu) and the
// AdamW step that writes a weight's FP8 cast (optim/adamw_segments.cu) share
// them.

#include <cstdint>

#include <cuda_fp8.h>

namespace ddp::detail {

/// |x| as int bits: for non-negative floats (NaN included, after fabsf) the
/// integer order is the float order, so integer max and atomicMax give the
/// amax, NaN winning as in ATen's reductions.
__device__ __forceinline__ int abs_bits(float x) { return __float_as_int(fabsf(x)); }

template <__nv_fp8_interpretation_t kFormat>
__device__ __forceinline__ uint32_t to_float8x4(float a, float b, float c, float d) {
  // Rounds to nearest even; SATFINITE maps overflow (infinities included) to
  // the largest finite value and keeps NaN, so the kernel clamps nothing
  // itself. The first value lands in the lowest byte.
  const uint32_t low = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kFormat);
  const uint32_t high = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, kFormat);
  return low | (high << 16);
}

/// A 4 x 4 block of bytes transposed: the words of 4 rows (byte i of a word
/// being column i) become the words of its 4 columns (byte i being row i).
__device__ __forceinline__ void transpose_4x4_bytes(const uint32_t (&rows)[4], uint32_t (&columns)[4]) {
  const uint32_t lo01 = __byte_perm(rows[0], rows[1], 0x5140);  // bytes 0 and 1 of rows 0 and 1, interleaved
  const uint32_t hi01 = __byte_perm(rows[0], rows[1], 0x7362);  // bytes 2 and 3
  const uint32_t lo23 = __byte_perm(rows[2], rows[3], 0x5140);
  const uint32_t hi23 = __byte_perm(rows[2], rows[3], 0x7362);
  columns[0] = __byte_perm(lo01, lo23, 0x5410);
  columns[1] = __byte_perm(lo01, lo23, 0x7632);
  columns[2] = __byte_perm(hi01, hi23, 0x5410);
  columns[3] = __byte_perm(hi01, hi23, 0x7632);
}

}  // namespace ddp::detail
