#pragma once

// The FP8 cast of Float8Linear as one CUDA kernel. Unfused, a cast costs a
// scaling multiply, a conversion, an amax reduction and, for at::_scaled_mm's
// column-major operands, a strided transpose of the result: several passes
// over the tensor, which on LLaMA-sized layers cost more than the FP8 GEMMs
// save. No CUDA headers here: float8_scaling.cpp includes it.

#include <vector>

#include <ATen/core/Tensor.h>

namespace ddp::detail {

/// The smallest amax a scale is computed from: keeps an all-zero tensor from
/// giving an infinite scale.
constexpr float kFloat8MinAmax = 1e-12f;

/// Where cast_to_float8 takes its scale from: a 0-dim fp32 tensor on the
/// input's device, read by the kernel (never by the host).
struct Float8CastScale {
  at::Tensor value;
  /// False: `value` is the scale (delayed scaling). True: `value` is the
  /// tensor's amax and the scale is largest / max(amax, kFloat8MinAmax)
  /// (current scaling), formed in the kernel instead of by three 1-element
  /// ATen kernels.
  bool from_amax = false;
};

/// What cast_to_float8 writes; undefined members are not written.
struct Float8CastOutputs {
  /// [M, K] row-major; its dtype (at::kFloat8_e4m3fn or at::kFloat8_e5m2)
  /// picks the format. May be undefined where only the transpose is needed.
  at::Tensor data;
  /// [K, M] row-major, the same dtype and values: the transpose, or what
  /// at::_scaled_mm reads as `data` in column-major order. At least one of
  /// data and transposed must be given.
  at::Tensor transposed;
  /// 0-dim fp32: max |input| (NaN if the input has one), before scaling,
  /// max-accumulated into what it holds: zero it beforehand.
  at::Tensor amax;
  /// 0-dim fp32: 1 / scale, what at::_scaled_mm takes to undo the scaling.
  at::Tensor inverse_scale;
};

/// Everything a kernel needs to write one FP8 cast of values it computes
/// itself (float8_tile.cuh), as cast_to_float8 writes a tensor's: where the
/// cast goes, its scale, and the format's largest value.
struct Float8Destination {
  Float8CastOutputs outputs;
  Float8CastScale scale;
  float largest = 0;
};

/// Writes outputs.data = saturate(input * scale) in one pass over `input`
/// (and its transpose and amax in the same pass), on the current CUDA stream
/// of input's device, without synchronising with the host.
///
/// input: [M, K] contiguous bf16, fp16 or fp32 on a CUDA device. The product
/// is taken in fp32, clamped to [-largest, largest] (NaN stays NaN) and
/// rounded to nearest even.
///
/// Defined only where float8_cast.cu is compiled: LibTorch >= 2.1 with CUDA
/// (DDP_WITH_CUDA_KERNELS), as is update_amax_histories.
void cast_to_float8(const at::Tensor& input, const Float8CastScale& scale, float largest,
                    const Float8CastOutputs& outputs);

/// One amax history of delayed scaling and what update_amax_histories does to it.
struct AmaxHistoryUpdate {
  /// [length] fp32, newest first.
  at::Tensor history;
  /// 0-dim fp32: the amax to enter as the newest entry, zeroed for the next
  /// cast to accumulate into. Undefined: the history is left as it is and only
  /// the scale is recomputed (after the amaxes were reduced across ranks).
  at::Tensor amax;
  /// 0-dim fp32, recomputed.
  at::Tensor scale;
  /// The format's largest value / 2^margin.
  float target = 0;
  /// The history's amax is its maximum; false: its newest entry.
  bool use_max = true;
};

/// Delayed scaling's bookkeeping, where ATen takes a roll, two copies and
/// five 1-element kernels per history: for each update, shifts `history` by
/// one, enters *amax as its newest entry and zeroes *amax; then sets
/// scale = target / max(history's amax, kFloat8MinAmax). An amax that is not
/// finite and > 0 (nothing recorded yet, an all-zero tensor, an overflow,
/// NaN) keeps the old scale, as in Transformer Engine. With `entered` ([n]
/// fp32, n = updates.size()), entered[i] enters history i in place of
/// *updates[i].amax (which is still zeroed): the amaxes reduced across ranks.
///
/// One block per history (histories are short: Transformer Engine's default
/// is 1024 entries), many histories per launch: a model's layers need a few
/// launches, not one per cast. All tensors on one CUDA device; runs on its
/// current stream.
void update_amax_histories(const std::vector<AmaxHistoryUpdate>& updates, const at::Tensor& entered = {});

}  // namespace ddp::detail
