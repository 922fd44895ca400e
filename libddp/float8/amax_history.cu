#include <algorithm>
#include <cstdint>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "cuda/cuda_check.h"
#include "cuda/warp_reduce.cuh"
#include "float8/kernels.h"
#include "float8/scaling.h"
#include "float8/tile.cuh"

namespace ddp::detail {
namespace {

using float8_tiles::at_least_min_amax;
using float8_tiles::check_scalar;

constexpr int kHistoryThreads = 256;
// Histories per launch: their pointers travel as a kernel parameter, which
// stays within the 4 KiB every CUDA version accepts.
constexpr int kHistoriesPerLaunch = 64;

struct HistoryPointers {
  float* history;
  float* amax;  // the pending amax; null: only the scale is recomputed
  float* scale;
  int64_t length;
  float target;
  bool use_max;
};

struct HistoryBatch {
  HistoryPointers histories[kHistoriesPerLaunch];
};
static_assert(sizeof(HistoryBatch) + sizeof(float*) <= 4096, "the kernel parameters must fit in 4 KiB");

/// See update_amax_histories: block b updates history b of the batch, with
/// entered[b] (if given) as its newest amax.
__global__ void __launch_bounds__(kHistoryThreads)
    update_amax_histories_kernel(const HistoryBatch batch, const float* __restrict__ entered) {
  const HistoryPointers h = batch.histories[blockIdx.x];
  float* const history = h.history;
  const bool shift = h.amax != nullptr;
  __shared__ float newest;
  __shared__ int warp_max[kHistoryThreads / 32];
  if (threadIdx.x == 0 && shift) {
    newest = entered != nullptr ? entered[blockIdx.x] : *h.amax;
    *h.amax = 0.0f;
  }
  __syncthreads();

  // The shift goes from the last chunk to the first: a chunk reads the
  // entries one below its own before any of them is overwritten, and the
  // barrier keeps a chunk's reads ahead of its writes.
  int max_bits = 0;
  const int64_t last_chunk = (h.length - 1) / kHistoryThreads * kHistoryThreads;
  for (int64_t chunk = last_chunk; chunk >= 0; chunk -= kHistoryThreads) {
    const int64_t i = chunk + threadIdx.x;
    float value = 0.0f;
    if (i < h.length) value = !shift ? history[i] : (i == 0 ? newest : history[i - 1]);
    __syncthreads();
    if (i < h.length) {
      if (shift) history[i] = value;
      max_bits = max(max_bits, abs_bits(value));
    }
  }
  max_bits = detail::warp_max(max_bits);
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = max_bits;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kHistoryThreads / 32; ++w) max_bits = max(max_bits, warp_max[w]);
    // The history holds amaxes (>= 0 or NaN), so the bits' maximum is theirs.
    const float history_amax = h.use_max ? __int_as_float(max_bits) : (shift ? newest : history[0]);
    if (isfinite(history_amax) && history_amax > 0.0f) *h.scale = h.target / at_least_min_amax(history_amax);
  }
}

}  // namespace

void update_amax_histories(const std::vector<DelayedScalingState*>& states, bool enter_amaxes,
                           const at::Tensor& entered) {
  const char* const what = "update_amax_histories: ";
  if (states.empty()) return;
  const at::Tensor& first = states.front()->amax_history;
  for (const DelayedScalingState* state : states) {
    const at::Tensor& history = state->amax_history;
    TORCH_CHECK(history.is_cuda() && history.device() == first.device() && history.dim() == 1 && history.numel() > 0 &&
                    history.is_contiguous() && history.scalar_type() == at::kFloat,
                what, "every history must be a non-empty contiguous 1-D fp32 tensor on ", first.device(), ", got ",
                history.sizes(), " ", history.scalar_type(), " on ", history.device());
    check_scalar(state->scale, history, what, "scale");
    check_scalar(state->pending_amax, history, what, "amax");
  }
  const int64_t count = static_cast<int64_t>(states.size());
  if (entered.defined()) {
    TORCH_CHECK(enter_amaxes, what, "amaxes to enter were given, but enter_amaxes is off");
    TORCH_CHECK(entered.device() == first.device() && entered.dim() == 1 && entered.numel() == count &&
                    entered.is_contiguous() && entered.scalar_type() == at::kFloat,
                what, "entered must be a contiguous [", count, "] fp32 tensor on ", first.device(), ", got ",
                entered.sizes(), " ", entered.scalar_type(), " on ", entered.device());
  }
  const c10::cuda::CUDAGuard device_guard(first.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(first.get_device());
  for (int64_t start = 0; start < count; start += kHistoriesPerLaunch) {
    const int64_t blocks = std::min<int64_t>(kHistoriesPerLaunch, count - start);
    HistoryBatch batch{};
    for (int64_t b = 0; b < blocks; ++b) {
      DelayedScalingState& state = *states[start + b];
      batch.histories[b] = {state.amax_history.data_ptr<float>(),
                            enter_amaxes ? state.pending_amax.data_ptr<float>() : nullptr,
                            state.scale.data_ptr<float>(),
                            state.amax_history.numel(),
                            state.scale_target,
                            state.use_max};
    }
    update_amax_histories_kernel<<<static_cast<unsigned>(blocks), kHistoryThreads, 0, stream>>>(
        batch, entered.defined() ? entered.data_ptr<float>() + start : nullptr);
    DDP_CUDA_CHECK_LAUNCH("update_amax_histories_kernel");
  }
}

}  // namespace ddp::detail
