#include "fused_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include "cuda_values.cuh"

namespace llama::kernels {
namespace {

using examples::cuda::from_float;
using examples::cuda::Pack;
using examples::cuda::to_float;
using examples::cuda::with_cuda_type;
using examples::cuda::with_pack;

constexpr int kThreads = 256;

/// Softmax statistics of a row: its running maximum and the sum of
/// exp(x - max) over the elements seen.
struct SoftmaxStats {
  float max = -INFINITY;
  float sum = 0;

  __device__ void add(float x) {
    if (x > max) {
      sum = sum * expf(max - x) + 1.0f;
      max = x;
    } else {
      sum += expf(x - max);
    }
  }

  __device__ void merge(SoftmaxStats other) {
    const float merged = fmaxf(max, other.max);
    if (merged == -INFINITY) return;  // both empty (or all -inf)
    sum = sum * expf(max - merged) + other.sum * expf(other.max - merged);
    max = merged;
  }
};

/// The statistics of the whole block's elements, returned to every thread.
/// Every thread of the block must call it; blockDim.x a multiple of 32, at most kThreads.
__device__ SoftmaxStats block_softmax_stats(SoftmaxStats stats) {
  __shared__ SoftmaxStats warp_stats[kThreads / 32];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    SoftmaxStats other;
    other.max = __shfl_xor_sync(0xffffffffu, stats.max, offset);
    other.sum = __shfl_xor_sync(0xffffffffu, stats.sum, offset);
    stats.merge(other);
  }
  __syncthreads();
  if (threadIdx.x % 32 == 0) warp_stats[threadIdx.x / 32] = stats;
  __syncthreads();
  SoftmaxStats total;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total.merge(warp_stats[w]);
  return total;
}

// One block per row of logits: one pass for the row's softmax statistics
// (online, as flash attention keeps them), whose log-sum-exp backward reuses.
//   loss = log(sum(exp(x))) - x[target], 0 for an ignored row
template <typename T, int N>
__global__ void cross_entropy_forward_kernel(const T* __restrict__ logits, const int64_t* __restrict__ targets,
                                             float* __restrict__ losses, float* __restrict__ log_sum_exp, int64_t vocab,
                                             int64_t ignore_index) {
  const int64_t row = blockIdx.x;
  const T* row_logits = logits + row * vocab;
  const auto* packs = reinterpret_cast<const Pack<T, N>*>(row_logits);
  SoftmaxStats stats;
  for (int64_t i = threadIdx.x; i < vocab / N; i += blockDim.x) {
    const Pack<T, N> p = packs[i];
#pragma unroll
    for (int k = 0; k < N; ++k) stats.add(to_float(p.v[k]));
  }
  stats = block_softmax_stats(stats);
  if (threadIdx.x == 0) {
    const float lse = stats.max + logf(stats.sum);
    log_sum_exp[row] = lse;
    const int64_t target = targets[row];
    if (target == ignore_index) {
      losses[row] = 0;
    } else {
      CUDA_KERNEL_ASSERT(target >= 0 && target < vocab && "cross_entropy: target out of [0, vocab)");
      losses[row] = lse - to_float(row_logits[target]);
    }
  }
}

//   grad = scale * (softmax(x) - onehot(target)), 0 for an ignored row,
// scale (on the device) being the loss's gradient over the counted rows.
template <typename T, int N>
__global__ void cross_entropy_backward_kernel(const float* __restrict__ scale, const T* __restrict__ logits,
                                              const int64_t* __restrict__ targets,
                                              const float* __restrict__ log_sum_exp, T* __restrict__ grad,
                                              int64_t vocab, int64_t ignore_index) {
  const int64_t row = blockIdx.x;
  const int64_t target = targets[row];
  const float s = target == ignore_index ? 0.0f : *scale;
  const float lse = log_sum_exp[row];
  const auto* in = reinterpret_cast<const Pack<T, N>*>(logits + row * vocab);
  auto* out = reinterpret_cast<Pack<T, N>*>(grad + row * vocab);
  for (int64_t i = threadIdx.x; i < vocab / N; i += blockDim.x) {
    const Pack<T, N> p = in[i];
    Pack<T, N> g;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float onehot = i * N + k == target ? 1.0f : 0.0f;
      g.v[k] = from_float<T>(s * (expf(to_float(p.v[k]) - lse) - onehot));
    }
    out[i] = g;
  }
}

// One block per token: its position gives the row of cos and sin, and the
// threads walk the (head, pair) of that token.
template <typename T>
__global__ void rotate_pairs_kernel(const T* __restrict__ x, const float* __restrict__ cos,
                                    const float* __restrict__ sin, T* __restrict__ y, int seq, int pairs_per_head,
                                    int pairs_per_token, float sin_sign) {
  const int64_t token = blockIdx.x;
  const int64_t angle_row = (token % seq) * pairs_per_head;
  const auto* in = reinterpret_cast<const Pack<T, 2>*>(x) + token * pairs_per_token;
  auto* out = reinterpret_cast<Pack<T, 2>*>(y) + token * pairs_per_token;
  for (int i = threadIdx.x; i < pairs_per_token; i += blockDim.x) {
    const int j = i % pairs_per_head;
    const float c = cos[angle_row + j];
    const float s = sin_sign * sin[angle_row + j];
    const Pack<T, 2> p = in[i];
    const float even = to_float(p.v[0]);
    const float odd = to_float(p.v[1]);
    Pack<T, 2> r;
    r.v[0] = from_float<T>(even * c - odd * s);
    r.v[1] = from_float<T>(even * s + odd * c);
    out[i] = r;
  }
}

/// The merged rows in T: what the rows hold is the gradient itself.
template <typename T>
struct RowsInValues {
  Pack<T, 2>* rows;
  __device__ __forceinline__ void write(int64_t pair, const Pack<T, 2>& r) { rows[pair] = r; }
  __device__ __forceinline__ void finish() {}
};

/// The merged rows as the FP8 cast a Float8Linear takes for its output's
/// gradient (ddp::float8::output_gradient_destination): each value as the
/// rows in T would hold it, times the scale, rounded to nearest even and
/// saturated; its |value| max-accumulated into the amax as the bits of a
/// non-negative float (integer order is float order there, NaN the largest,
/// as in ATen's amax). Every thread of the block calls finish().
template <typename T, __nv_fp8_interpretation_t kFormat>
struct RowsInFloat8 {
  __nv_fp8x2_storage_t* rows;
  const float* scale;  // on the device
  int* amax_bits;
  int max_bits = 0;

  __device__ __forceinline__ void write(int64_t pair, const Pack<T, 2>& r) {
    const float even = to_float(r.v[0]), odd = to_float(r.v[1]);
    const float s = __ldg(scale);
    max_bits = max(max_bits, max(__float_as_int(fabsf(even)), __float_as_int(fabsf(odd))));
    rows[pair] = __nv_cvt_float2_to_fp8x2(make_float2(even * s, odd * s), __NV_SATFINITE, kFormat);
  }
  __device__ __forceinline__ void finish() {
    __shared__ int warp_max[1024 / 32];
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) max_bits = max(max_bits, __shfl_xor_sync(~0u, max_bits, offset));
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = max_bits;
    __syncthreads();
    if (threadIdx.x == 0) {
      int block_max = 0;
      for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) block_max = max(block_max, warp_max[w]);
      atomicMax(amax_bits, block_max);
    }
  }
};

/// The rows of an attention projection's output [tokens, row_pairs pairs]:
/// a token's q, k and v side by side, as one GEMM wrote them (q_pairs, then
/// k_pairs, then v's). Split (kMerge false): reads a row, writes q and k
/// rotated and v as is into three tensors of their own. Merged (kMerge true,
/// sin_sign -1: the inverse rotation, their gradient): reads the three
/// gradients and writes the row through `merged` (in T, or as the
/// projection's FP8 output gradient), so that the projection's backward gets
/// its output's gradient whole, where autograd would fill a zero tensor per
/// slice and sum them.
template <typename T, bool kMerge, typename MergedRows = RowsInValues<T>>
__global__ void qkv_rotation_kernel(Pack<T, 2>* __restrict__ rows, Pack<T, 2>* __restrict__ q,
                                    Pack<T, 2>* __restrict__ k, Pack<T, 2>* __restrict__ v,
                                    const float* __restrict__ cos, const float* __restrict__ sin, int seq,
                                    int pairs_per_head, int q_pairs, int k_pairs, int row_pairs, float sin_sign,
                                    MergedRows merged) {
  const int64_t token = blockIdx.x;
  const int64_t angle_row = (token % seq) * pairs_per_head;
  const int v_pairs = row_pairs - q_pairs - k_pairs;
  for (int i = threadIdx.x; i < row_pairs; i += blockDim.x) {
    const bool rotated = i < q_pairs + k_pairs;
    Pack<T, 2>* part = i < q_pairs ? q + token * q_pairs + i
                       : rotated   ? k + token * k_pairs + (i - q_pairs)
                                   : v + token * v_pairs + (i - q_pairs - k_pairs);
    const Pack<T, 2> p = kMerge ? *part : rows[token * row_pairs + i];
    Pack<T, 2> r = p;
    if (rotated) {
      // q_pairs is a whole number of heads: k's pairs count from a head's start too.
      const int j = i % pairs_per_head;
      const float c = cos[angle_row + j];
      const float s = sin_sign * sin[angle_row + j];
      const float even = to_float(p.v[0]);
      const float odd = to_float(p.v[1]);
      r.v[0] = from_float<T>(even * c - odd * s);
      r.v[1] = from_float<T>(even * s + odd * c);
    }
    if (kMerge) {
      merged.write(token * row_pairs + i, r);
    } else {
      *part = r;
    }
  }
  if (kMerge) merged.finish();
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float swiglu(float gate, float up) { return gate * sigmoid(gate) * up; }

template <typename T, int N>
__global__ void swiglu_forward_kernel(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ y,
                                      int64_t packs) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < packs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Pack<T, N> a = reinterpret_cast<const Pack<T, N>*>(gate)[i];
    const Pack<T, N> b = reinterpret_cast<const Pack<T, N>*>(up)[i];
    Pack<T, N> out;
#pragma unroll
    for (int k = 0; k < N; ++k) out.v[k] = from_float<T>(swiglu(to_float(a.v[k]), to_float(b.v[k])));
    reinterpret_cast<Pack<T, N>*>(y)[i] = out;
  }
}

//   d/d gate = grad * up * sigmoid(gate) * (1 + gate * (1 - sigmoid(gate)))
//   d/d up   = grad * silu(gate)
__device__ __forceinline__ void swiglu_gradients(float grad, float gate, float up, float& grad_gate, float& grad_up) {
  const float s = sigmoid(gate);
  grad_gate = grad * up * s * (1.0f + gate * (1.0f - s));
  grad_up = grad * gate * s;
}

template <typename T, int N>
__global__ void swiglu_backward_kernel(const T* __restrict__ grad_y, const T* __restrict__ gate,
                                       const T* __restrict__ up, T* __restrict__ grad_gate, T* __restrict__ grad_up,
                                       int64_t packs) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < packs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Pack<T, N> gy = reinterpret_cast<const Pack<T, N>*>(grad_y)[i];
    const Pack<T, N> a = reinterpret_cast<const Pack<T, N>*>(gate)[i];
    const Pack<T, N> b = reinterpret_cast<const Pack<T, N>*>(up)[i];
    Pack<T, N> da, db;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      float grad_gate;
      float grad_up;
      swiglu_gradients(to_float(gy.v[k]), to_float(a.v[k]), to_float(b.v[k]), grad_gate, grad_up);
      da.v[k] = from_float<T>(grad_gate);
      db.v[k] = from_float<T>(grad_up);
    }
    reinterpret_cast<Pack<T, N>*>(grad_gate)[i] = da;
    reinterpret_cast<Pack<T, N>*>(grad_up)[i] = db;
  }
}

bool aligned(const void* pointer, int64_t bytes) { return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0; }

void check_input(const at::Tensor& t, const at::Tensor& like, const char* what, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.device() == like.device() && t.is_contiguous(), what, ": ", name,
              " must be contiguous on ", like.device(), ", got ", t.sizes(), " on ", t.device());
}

/// Blocks of kThreads that fill the current GPU once (2048 threads per SM).
int64_t resident_blocks() {
  return at::cuda::getCurrentDeviceProperties()->multiProcessorCount * (2048 / kThreads);
}

/// Blocks for a grid-stride loop over `packs` elements: enough to fill the GPU.
unsigned grid_for(int64_t packs) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min((packs + kThreads - 1) / kThreads, resident_blocks())));
}

}  // namespace

at::Tensor rotate_pairs(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool inverse) {
  const char* what = "llama::kernels::rotate_pairs";
  check_input(x, x, what, "x");
  check_input(cos, x, what, "cos");
  check_input(sin, x, what, "sin");
  TORCH_CHECK(x.dim() == 4 && x.size(3) % 2 == 0 && cos.dim() == 2 && cos.size(0) == x.size(1) &&
                  cos.size(1) == x.size(3) / 2 && sin.sizes() == cos.sizes() && cos.scalar_type() == at::kFloat &&
                  sin.scalar_type() == at::kFloat,
              what, ": x [batch, seq, heads, head_dim] and fp32 cos, sin [seq, head_dim / 2] expected, got ",
              x.sizes(), ", ", cos.sizes(), ", ", sin.sizes());
  TORCH_CHECK(aligned(x.data_ptr(), 2 * x.element_size()), what, ": x must start on a pair boundary");
  const int64_t tokens = x.size(0) * x.size(1);
  const int64_t pairs_per_head = x.size(3) / 2;
  const int64_t pairs_per_token = x.size(2) * pairs_per_head;
  // The kernel's int loop over a token's pairs steps past the end by up to a block.
  TORCH_CHECK(tokens <= INT32_MAX && pairs_per_token <= INT32_MAX - kThreads, what, ": x of ", x.sizes(),
              " is too large");
  at::Tensor y = at::empty_like(x);
  if (x.numel() == 0) return y;
  const c10::cuda::CUDAGuard device_guard(x.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, (pairs_per_token + 31) / 32 * 32));
  with_cuda_type(x.scalar_type(), what, [&](auto type) {
    using T = typename decltype(type)::type;
    rotate_pairs_kernel<T><<<static_cast<unsigned>(tokens), threads, 0, stream>>>(
        static_cast<const T*>(x.data_ptr()), cos.data_ptr<float>(), sin.data_ptr<float>(),
        static_cast<T*>(y.data_ptr()), static_cast<int>(x.size(1)), static_cast<int>(pairs_per_head),
        static_cast<int>(pairs_per_token), inverse ? -1.0f : 1.0f);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return y;
}

namespace {

/// Launches qkv_rotation_kernel over the rows of a projection's output
/// [batch, seq, (heads + 2 kv_heads) * head_dim] and q, k, v [batch, seq,
/// heads or kv_heads, head_dim]: `rows`, that tensor (read when split,
/// written when merged), or undefined where `merged_for` writes the merged
/// rows elsewhere. merged_for(Pack<T, 2>* rows) gives the kernel's writer of
/// the merged rows for q's dtype T.
template <bool kMerge, typename MergedFor>
void rotate_qkv(const at::Tensor& rows, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& cos, const at::Tensor& sin, const char* what, MergedFor merged_for) {
  for (const auto& [t, name] :
       {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}, std::pair{&cos, "cos"}, std::pair{&sin, "sin"}}) {
    check_input(*t, q, what, name);
  }
  const int64_t head_dim = q.size(3);
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes() && head_dim % 2 == 0 && k.size(3) == head_dim &&
                  k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.scalar_type() == q.scalar_type() &&
                  v.scalar_type() == q.scalar_type() && cos.dim() == 2 && cos.size(0) == q.size(1) &&
                  cos.size(1) == head_dim / 2 && sin.sizes() == cos.sizes() && cos.scalar_type() == at::kFloat &&
                  sin.scalar_type() == at::kFloat,
              what,
              ": q [batch, seq, heads, head_dim], k and v [batch, seq, kv_heads, head_dim] of q's dtype, fp32 cos "
              "and sin [seq, head_dim / 2] expected, got ",
              q.sizes(), ", ", k.sizes(), ", ", v.sizes(), ", ", cos.sizes(), ", ", sin.sizes());
  const int64_t width = (q.size(2) + 2 * k.size(2)) * head_dim;
  if (rows.defined()) {
    check_input(rows, q, what, "qkv");
    TORCH_CHECK(rows.dim() == 3 && rows.size(0) == q.size(0) && rows.size(1) == q.size(1) && rows.size(2) == width &&
                    rows.scalar_type() == q.scalar_type(),
                what, ": qkv [batch, seq, (heads + 2 kv_heads) * head_dim] of q's dtype expected, got ", rows.sizes(),
                " for q ", q.sizes(), " and k ", k.sizes());
  }
  for (const at::Tensor* t : {&rows, &q, &k, &v}) {
    TORCH_CHECK(!t->defined() || aligned(t->data_ptr(), 2 * t->element_size()), what,
                ": every tensor must start on a pair boundary");
  }
  const int64_t tokens = q.size(0) * q.size(1);
  const int64_t row_pairs = width / 2;
  TORCH_CHECK(tokens <= INT32_MAX && row_pairs <= INT32_MAX - kThreads, what, ": qkv of ", tokens, " tokens x ", width,
              " is too large");
  if (tokens == 0 || row_pairs == 0) return;
  const c10::cuda::CUDAGuard device_guard(q.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, (row_pairs + 31) / 32 * 32));
  with_cuda_type(q.scalar_type(), what, [&](auto type) {
    using T = typename decltype(type)::type;
    const auto pairs = [](const at::Tensor& t) {
      return t.defined() ? static_cast<Pack<T, 2>*>(t.data_ptr()) : static_cast<Pack<T, 2>*>(nullptr);
    };
    qkv_rotation_kernel<T, kMerge><<<static_cast<unsigned>(tokens), threads, 0, stream>>>(
        pairs(rows), pairs(q), pairs(k), pairs(v), cos.data_ptr<float>(), sin.data_ptr<float>(),
        static_cast<int>(q.size(1)), static_cast<int>(head_dim / 2), static_cast<int>(q.size(2) * head_dim / 2),
        static_cast<int>(k.size(2) * head_dim / 2), static_cast<int>(row_pairs), kMerge ? -1.0f : 1.0f,
        merged_for(pairs(rows)));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

/// rotate_qkv's writer of the merged rows in their own dtype, into `rows`.
struct InValues {
  template <typename T>
  RowsInValues<T> operator()(Pack<T, 2>* rows) const {
    return {rows};
  }
};

/// rotate_qkv's writer of the merged rows as the FP8 cast `cast` of the
/// format kFormat.
template <__nv_fp8_interpretation_t kFormat>
struct InFloat8 {
  const ddp::Float8Tensor& cast;
  template <typename T>
  RowsInFloat8<T, kFormat> operator()(Pack<T, 2>* /*rows: none*/) const {
    return {static_cast<__nv_fp8x2_storage_t*>(cast.data.data_ptr()), cast.scale.data_ptr<float>(),
            reinterpret_cast<int*>(cast.amax.data_ptr<float>())};
  }
};

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> split_rotate_qkv(const at::Tensor& qkv, const at::Tensor& cos,
                                                                const at::Tensor& sin, int64_t heads,
                                                                int64_t kv_heads) {
  const char* what = "llama::kernels::split_rotate_qkv";
  TORCH_CHECK(qkv.dim() == 3 && heads > 0 && kv_heads > 0 && qkv.size(2) % (heads + 2 * kv_heads) == 0, what,
              ": qkv [batch, seq, (heads + 2 kv_heads) * head_dim] expected, got ", qkv.sizes(), " for ", heads,
              " heads and ", kv_heads, " key/value heads");
  const int64_t head_dim = qkv.size(2) / (heads + 2 * kv_heads);
  at::Tensor q = at::empty({qkv.size(0), qkv.size(1), heads, head_dim}, qkv.options());
  at::Tensor k = at::empty({qkv.size(0), qkv.size(1), kv_heads, head_dim}, qkv.options());
  at::Tensor v = at::empty_like(k);
  rotate_qkv</*kMerge=*/false>(qkv, q, k, v, cos, sin, what, InValues{});
  return {std::move(q), std::move(k), std::move(v)};
}

at::Tensor merge_rotate_qkv(const at::Tensor& grad_q, const at::Tensor& grad_k, const at::Tensor& grad_v,
                            const at::Tensor& cos, const at::Tensor& sin) {
  const char* what = "llama::kernels::merge_rotate_qkv";
  TORCH_CHECK(grad_q.dim() == 4 && grad_k.dim() == 4, what,
              ": grad_q and grad_k [batch, seq, heads, head_dim] expected, got ", grad_q.sizes(), ", ", grad_k.sizes());
  at::Tensor grad_qkv = at::empty(
      {grad_q.size(0), grad_q.size(1), (grad_q.size(2) + 2 * grad_k.size(2)) * grad_q.size(3)}, grad_q.options());
  rotate_qkv</*kMerge=*/true>(grad_qkv, grad_q, grad_k, grad_v, cos, sin, what, InValues{});
  return grad_qkv;
}

void merge_rotate_qkv_to_float8(const at::Tensor& grad_q, const at::Tensor& grad_k, const at::Tensor& grad_v,
                                const at::Tensor& cos, const at::Tensor& sin, const ddp::Float8Tensor& cast) {
  const char* what = "llama::kernels::merge_rotate_qkv_to_float8";
  TORCH_CHECK(grad_q.dim() == 4 && grad_k.dim() == 4, what,
              ": grad_q and grad_k [batch, seq, heads, head_dim] expected, got ", grad_q.sizes(), ", ", grad_k.sizes());
  const int64_t tokens = grad_q.size(0) * grad_q.size(1);
  const int64_t width = (grad_q.size(2) + 2 * grad_k.size(2)) * grad_q.size(3);
  const at::Tensor& data = cast.data;
  TORCH_CHECK(data.defined() && data.dim() == 2 && data.size(0) == tokens && data.size(1) == width &&
                  data.is_contiguous() && data.element_size() == 1 && data.device() == grad_q.device() &&
                  aligned(data.data_ptr(), 2) && cast.scale.defined() && cast.scale.numel() == 1 &&
                  cast.scale.scalar_type() == at::kFloat && cast.scale.device() == grad_q.device() &&
                  cast.amax.defined() && cast.amax.numel() == 1 && cast.amax.scalar_type() == at::kFloat &&
                  cast.amax.device() == grad_q.device(),
              what, ": an FP8 cast [", tokens, ", ", width, "] with fp32 scale and amax on q's device expected, got ",
              data.defined() ? data.sizes() : at::IntArrayRef{});
  if (data.scalar_type() == at::kFloat8_e5m2) {
    rotate_qkv</*kMerge=*/true>(at::Tensor(), grad_q, grad_k, grad_v, cos, sin, what, InFloat8<__NV_E5M2>{cast});
  } else {
    TORCH_CHECK(data.scalar_type() == at::kFloat8_e4m3fn, what, ": an E5M2 or E4M3 cast expected, got ",
                data.scalar_type());
    rotate_qkv</*kMerge=*/true>(at::Tensor(), grad_q, grad_k, grad_v, cos, sin, what, InFloat8<__NV_E4M3>{cast});
  }
}

at::Tensor swiglu_forward(const at::Tensor& gate, const at::Tensor& up) {
  const char* what = "llama::kernels::swiglu_forward";
  check_input(gate, gate, what, "gate");
  check_input(up, gate, what, "up");
  TORCH_CHECK(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type(), what,
              ": gate and up of one shape and dtype expected, got ", gate.sizes(), " ", gate.scalar_type(), " and ",
              up.sizes(), " ", up.scalar_type());
  at::Tensor y = at::empty_like(gate);
  if (gate.numel() == 0) return y;
  const c10::cuda::CUDAGuard device_guard(gate.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t bytes = 4 * gate.element_size();
  const bool vectorized = gate.numel() % 4 == 0 && aligned(gate.data_ptr(), bytes) && aligned(up.data_ptr(), bytes) &&
                          aligned(y.data_ptr(), bytes);
  const int64_t packs = vectorized ? gate.numel() / 4 : gate.numel();
  with_cuda_type(gate.scalar_type(), what, [&](auto type) {
    using T = typename decltype(type)::type;
    const auto launch = vectorized ? swiglu_forward_kernel<T, 4> : swiglu_forward_kernel<T, 1>;
    launch<<<grid_for(packs), kThreads, 0, stream>>>(static_cast<const T*>(gate.data_ptr()),
                                                     static_cast<const T*>(up.data_ptr()),
                                                     static_cast<T*>(y.data_ptr()), packs);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return y;
}

std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& grad_y, const at::Tensor& gate,
                                                  const at::Tensor& up) {
  const char* what = "llama::kernels::swiglu_backward";
  check_input(grad_y, gate, what, "grad_y");
  check_input(gate, gate, what, "gate");
  check_input(up, gate, what, "up");
  TORCH_CHECK(gate.sizes() == up.sizes() && grad_y.sizes() == gate.sizes() &&
                  gate.scalar_type() == up.scalar_type() && grad_y.scalar_type() == gate.scalar_type(),
              what, ": grad_y, gate and up of one shape and dtype expected");
  at::Tensor grad_gate = at::empty_like(gate);
  at::Tensor grad_up = at::empty_like(up);
  if (gate.numel() == 0) return {grad_gate, grad_up};
  const c10::cuda::CUDAGuard device_guard(gate.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t bytes = 4 * gate.element_size();
  const bool vectorized = gate.numel() % 4 == 0 && aligned(grad_y.data_ptr(), bytes) &&
                          aligned(gate.data_ptr(), bytes) && aligned(up.data_ptr(), bytes) &&
                          aligned(grad_gate.data_ptr(), bytes) && aligned(grad_up.data_ptr(), bytes);
  const int64_t packs = vectorized ? gate.numel() / 4 : gate.numel();
  with_cuda_type(gate.scalar_type(), what, [&](auto type) {
    using T = typename decltype(type)::type;
    const auto launch = vectorized ? swiglu_backward_kernel<T, 4> : swiglu_backward_kernel<T, 1>;
    launch<<<grid_for(packs), kThreads, 0, stream>>>(
        static_cast<const T*>(grad_y.data_ptr()), static_cast<const T*>(gate.data_ptr()),
        static_cast<const T*>(up.data_ptr()), static_cast<T*>(grad_gate.data_ptr()),
        static_cast<T*>(grad_up.data_ptr()), packs);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {grad_gate, grad_up};
}

namespace {

/// Logits [rows, vocab] and int64 targets [rows] on one device, contiguous.
void check_cross_entropy_inputs(const char* what, const at::Tensor& logits, const at::Tensor& targets) {
  check_input(logits, logits, what, "logits");
  check_input(targets, logits, what, "targets");
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) > 0 && targets.dim() == 1 && targets.size(0) == logits.size(0) &&
                  targets.scalar_type() == at::kLong,
              what, ": logits [rows, vocab > 0] and int64 targets [rows] expected, got ", logits.sizes(), " and ",
              targets.sizes(), " ", targets.scalar_type());
  TORCH_CHECK(logits.size(0) <= INT32_MAX, what, ": too many rows (", logits.size(0), ")");
}

}  // namespace

std::pair<at::Tensor, at::Tensor> cross_entropy_forward(const at::Tensor& logits, const at::Tensor& targets,
                                                        int64_t ignore_index) {
  const char* what = "llama::kernels::cross_entropy_forward";
  check_cross_entropy_inputs(what, logits, targets);
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  at::Tensor losses = at::empty({rows}, logits.options().dtype(at::kFloat));
  at::Tensor log_sum_exp = at::empty({rows}, logits.options().dtype(at::kFloat));
  if (rows == 0) return {losses, log_sum_exp};
  const c10::cuda::CUDAGuard device_guard(logits.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  with_pack(logits.scalar_type(), logits.size(1), {logits.data_ptr()}, what, [&](auto type, auto pack) {
    using T = typename decltype(type)::type;
    cross_entropy_forward_kernel<T, decltype(pack)::value><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        static_cast<const T*>(logits.data_ptr()), targets.data_ptr<int64_t>(), losses.data_ptr<float>(),
        log_sum_exp.data_ptr<float>(), vocab, ignore_index);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {losses, log_sum_exp};
}

at::Tensor cross_entropy_backward(const at::Tensor& scale, const at::Tensor& logits, const at::Tensor& targets,
                                  const at::Tensor& log_sum_exp, int64_t ignore_index) {
  const char* what = "llama::kernels::cross_entropy_backward";
  check_cross_entropy_inputs(what, logits, targets);
  check_input(scale, logits, what, "scale");
  check_input(log_sum_exp, logits, what, "log_sum_exp");
  TORCH_CHECK(scale.numel() == 1 && scale.scalar_type() == at::kFloat && log_sum_exp.scalar_type() == at::kFloat &&
                  log_sum_exp.numel() == logits.size(0),
              what, ": an fp32 scale of one element and fp32 log_sum_exp [rows] expected");
  at::Tensor grad = at::empty_like(logits);
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  if (rows == 0) return grad;
  const c10::cuda::CUDAGuard device_guard(logits.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  with_pack(
      logits.scalar_type(), logits.size(1), {logits.data_ptr(), grad.data_ptr()}, what, [&](auto type, auto pack) {
        using T = typename decltype(type)::type;
        cross_entropy_backward_kernel<T, decltype(pack)::value><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
            scale.data_ptr<float>(), static_cast<const T*>(logits.data_ptr()), targets.data_ptr<int64_t>(),
            log_sum_exp.data_ptr<float>(), static_cast<T*>(grad.data_ptr()), vocab, ignore_index);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
  return grad;
}

}  // namespace llama::kernels
