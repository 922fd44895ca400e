// Is cuDNN's FP8 attention worth wiring into LLaMA's fp8 step? Attention is
// 18.2 ms of LLaMA-1.1B's 87.5 ms fp8 step on an H200 and runs in bf16 there
// (ATen's SDPA on cuDNN's flash kernels; profile of 2026-11-28), while every
// linear layer around it already runs in FP8.
//
// For one layer's attention, forward and backward, causal, with grouped
// key/value heads:
//   bf16  ATen's scaled_dot_product_attention under autograd: what the
//         example runs today;
//   fp8   cuDNN's FP8 SDPA graphs through cudnn-frontend (sdpa_fp8 and
//         sdpa_fp8_backward): Q, K, V and O in E4M3, dO in E5M2 (else E4M3),
//         each with a per-tensor scale; dQ, dK and dV in bf16 where cuDNN
//         writes them so (they feed the projection's FP8 backward, which casts
//         its own input), else in FP8.
// The FP8 scales come from the bf16 reference's amax (current scaling), those
// of the softmax probabilities and their gradient from a calibration run's
// amax outputs, as delayed scaling would have them after one step. The FP8
// results are checked against the bf16 reference (largest difference over
// largest element, and the norm of the difference over the norm), the casts
// into FP8 are not timed (the rotary-embedding kernel would write them).
//
//   sdpa_fp8_bench [--shape tinyllama|llama2-7b] [--batch B] [--seq S] [--iterations 20] [--trials 5] [--json PATH]

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <cudnn_frontend.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cudnn/Handle.h>

#include "common/device_timing.h"
#include "common/run_info.h"
#include "flags.h"

namespace {

namespace fe = cudnn_frontend;
using TensorAttributes = std::shared_ptr<fe::graph::Tensor_attributes>;

/// One attention: q [batch, heads, seq, head_dim], k and v with kv_heads.
struct Shape {
  int64_t batch, heads, kv_heads, seq, head_dim;
  /// Multiply-adds of QK^T and PV counted twice, halved by the causal mask.
  double forward_flops() const { return 4.0 * batch * heads * seq * seq * head_dim / 2; }
  /// Flash attention's backward: five matmuls against the forward's two.
  double backward_flops() const { return 2.5 * forward_flops(); }
};

/// A failed cudnn-frontend call, with cudnn-frontend's reason.
void check(fe::error_t status, const std::string& what) {
  if (!status.is_good()) throw std::runtime_error(what + ": " + status.get_message());
}

/// [batch, heads, seq, head_dim] over memory laid out [batch, seq, heads,
/// head_dim] (as the projection writes it): cudnn-frontend's dims and strides.
std::vector<int64_t> bhsd(const Shape& s, int64_t heads) { return {s.batch, heads, s.seq, s.head_dim}; }
std::vector<int64_t> bshd_strides(const Shape& s, int64_t heads) {
  return {s.seq * heads * s.head_dim, s.head_dim, heads * s.head_dim, 1};
}

/// A bf16 tensor of those sizes in that memory: randn times `scale`.
at::Tensor activation(const Shape& s, int64_t heads, double scale) {
  return (torch::randn({s.batch, s.seq, heads, s.head_dim}, torch::TensorOptions(torch::kCUDA)) * scale)
      .to(torch::kBFloat16)
      .permute({0, 2, 1, 3});
}

/// A per-tensor FP8 copy and the scalars cuDNN reads for it.
struct Fp8Tensor {
  at::Tensor data;     ///< x * scale, rounded to the FP8 dtype, in x's memory layout.
  at::Tensor descale;  ///< [1] fp32: 1 / scale.
};

double fp8_max(at::ScalarType dtype) { return dtype == at::kFloat8_e5m2 ? 57344.0 : 448.0; }

Fp8Tensor to_fp8(const at::Tensor& x, at::ScalarType dtype) {
  const double scale = fp8_max(dtype) / std::max(x.abs().max().item<double>(), 1e-12);
  // Cast in x's memory layout: the graphs' strides are the bf16 tensors'.
  at::Tensor data = at::empty_strided(x.sizes(), x.strides(), x.options().dtype(dtype));
  data.copy_(x.to(torch::kFloat) * scale);
  return {data, torch::full({1}, 1.0 / scale, torch::TensorOptions(torch::kCUDA))};
}

at::Tensor scalar(double value) { return torch::full({1}, value, torch::TensorOptions(torch::kCUDA)); }

/// The FP8 scalars of one graph input that is a [1] fp32 tensor.
TensorAttributes scalar_input(fe::graph::Graph& graph, const char* name) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_dim({1, 1, 1, 1})
                          .set_stride({1, 1, 1, 1})
                          .set_data_type(fe::DataType_t::FLOAT));
}

void scalar_output(const TensorAttributes& t) {
  t->set_output(true).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1}).set_data_type(fe::DataType_t::FLOAT);
}

fe::DataType_t cudnn_type(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat8_e4m3fn: return fe::DataType_t::FP8_E4M3;
    case at::kFloat8_e5m2: return fe::DataType_t::FP8_E5M2;
    case at::kBFloat16: return fe::DataType_t::BFLOAT16;
    default: throw std::invalid_argument("no cuDNN type for this dtype");
  }
}

/// A built graph and the pointers of its tensors.
struct Built {
  std::unique_ptr<fe::graph::Graph> graph = std::make_unique<fe::graph::Graph>();
  std::unordered_map<TensorAttributes, void*> pack;
  at::Tensor workspace;

  void build(cudnnHandle_t handle, const std::string& what) {
    check(graph->validate(), what + ": validate");
    check(graph->build_operation_graph(handle), what + ": build_operation_graph");
    check(graph->create_execution_plans({fe::HeurMode_t::A}), what + ": create_execution_plans");
    check(graph->check_support(handle), what + ": check_support");
    check(graph->build_plans(handle), what + ": build_plans");
    int64_t bytes = 0;
    check(graph->get_workspace_size(bytes), what + ": get_workspace_size");
    workspace = torch::empty({std::max<int64_t>(bytes, 1)}, torch::TensorOptions(torch::kCUDA).dtype(torch::kByte));
  }
  void run(cudnnHandle_t handle, const std::string& what) {
    check(graph->execute(handle, pack, workspace.data_ptr()), what + ": execute");
  }
};

/// Everything the FP8 forward and backward read and write.
struct Fp8Attention {
  Fp8Tensor q, k, v, d_o;
  at::Tensor o, stats, d_q, d_k, d_v;
  at::Tensor scale_s = scalar(1), descale_s = scalar(1), scale_o = scalar(1), descale_o = scalar(1);
  at::Tensor scale_dp = scalar(1), descale_dp = scalar(1), scale_dq = scalar(1), scale_dk = scalar(1),
             scale_dv = scalar(1);
  at::Tensor amax_s = scalar(0), amax_o = scalar(0), amax_dp = scalar(0), amax_dq = scalar(0), amax_dk = scalar(0),
             amax_dv = scalar(0);
  at::ScalarType o_dtype = at::kFloat8_e4m3fn, grad_dtype = at::kBFloat16;
};

Built forward_graph(const Shape& s, Fp8Attention& a, float attn_scale, cudnnHandle_t handle) {
  Built b;
  fe::graph::Graph& g = *b.graph;
  g.set_io_data_type(fe::DataType_t::FP8_E4M3)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto tensor = [&](const char* name, int64_t heads) {
    return g.tensor(
        fe::graph::Tensor_attributes().set_name(name).set_dim(bhsd(s, heads)).set_stride(bshd_strides(s, heads)));
  };
  const auto q = tensor("Q", s.heads), k = tensor("K", s.kv_heads), v = tensor("V", s.kv_heads);
  const auto descale_q = scalar_input(g, "Descale_Q"), descale_k = scalar_input(g, "Descale_K"),
             descale_v = scalar_input(g, "Descale_V"), descale_s = scalar_input(g, "Descale_S"),
             scale_s = scalar_input(g, "Scale_S"), scale_o = scalar_input(g, "Scale_O");
  auto [o, stats, amax_s, amax_o] = g.sdpa_fp8(q, k, v, descale_q, descale_k, descale_v, descale_s, scale_s, scale_o,
                                               fe::graph::SDPA_fp8_attributes()
                                                   .set_name("sdpa_fp8")
                                                   .set_generate_stats(true)
                                                   .set_causal_mask(true)
                                                   .set_attn_scale(attn_scale));
  o->set_output(true)
      .set_dim(bhsd(s, s.heads))
      .set_stride(bshd_strides(s, s.heads))
      .set_data_type(cudnn_type(a.o_dtype));
  stats->set_output(true).set_data_type(fe::DataType_t::FLOAT);
  scalar_output(amax_s);
  scalar_output(amax_o);
  b.build(handle, "sdpa_fp8");
  b.pack = {{q, a.q.data.data_ptr()},
            {k, a.k.data.data_ptr()},
            {v, a.v.data.data_ptr()},
            {descale_q, a.q.descale.data_ptr()},
            {descale_k, a.k.descale.data_ptr()},
            {descale_v, a.v.descale.data_ptr()},
            {descale_s, a.descale_s.data_ptr()},
            {scale_s, a.scale_s.data_ptr()},
            {scale_o, a.scale_o.data_ptr()},
            {o, a.o.data_ptr()},
            {stats, a.stats.data_ptr()},
            {amax_s, a.amax_s.data_ptr()},
            {amax_o, a.amax_o.data_ptr()}};
  return b;
}

Built backward_graph(const Shape& s, Fp8Attention& a, float attn_scale, cudnnHandle_t handle) {
  Built b;
  fe::graph::Graph& g = *b.graph;
  g.set_io_data_type(fe::DataType_t::FP8_E4M3)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto tensor = [&](const char* name, int64_t heads, at::ScalarType dtype) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_dim(bhsd(s, heads))
                        .set_stride(bshd_strides(s, heads))
                        .set_data_type(cudnn_type(dtype)));
  };
  const auto q = tensor("Q", s.heads, at::kFloat8_e4m3fn), k = tensor("K", s.kv_heads, at::kFloat8_e4m3fn),
             v = tensor("V", s.kv_heads, at::kFloat8_e4m3fn), o = tensor("O", s.heads, a.o_dtype),
             d_o = tensor("dO", s.heads, a.d_o.data.scalar_type());
  const auto stats = g.tensor(fe::graph::Tensor_attributes()
                                  .set_name("Stats")
                                  .set_dim({s.batch, s.heads, s.seq, 1})
                                  .set_stride({s.heads * s.seq, s.seq, 1, 1})
                                  .set_data_type(fe::DataType_t::FLOAT));
  const auto descale_q = scalar_input(g, "Descale_Q"), descale_k = scalar_input(g, "Descale_K"),
             descale_v = scalar_input(g, "Descale_V"), descale_o = scalar_input(g, "Descale_O"),
             descale_do = scalar_input(g, "Descale_dO"), descale_s = scalar_input(g, "Descale_S"),
             descale_dp = scalar_input(g, "Descale_dP"), scale_s = scalar_input(g, "Scale_S"),
             scale_dq = scalar_input(g, "Scale_dQ"), scale_dk = scalar_input(g, "Scale_dK"),
             scale_dv = scalar_input(g, "Scale_dV"), scale_dp = scalar_input(g, "Scale_dP");
  auto [d_q, d_k, d_v, amax_dq, amax_dk, amax_dv, amax_dp] =
      g.sdpa_fp8_backward(q, k, v, o, d_o, stats, descale_q, descale_k, descale_v, descale_o, descale_do, descale_s,
                          descale_dp, scale_s, scale_dq, scale_dk, scale_dv, scale_dp,
                          fe::graph::SDPA_fp8_backward_attributes()
                              .set_name("sdpa_fp8_backward")
                              .set_causal_mask(true)
                              .set_attn_scale(attn_scale));
  d_q->set_output(true)
      .set_dim(bhsd(s, s.heads))
      .set_stride(bshd_strides(s, s.heads))
      .set_data_type(cudnn_type(a.grad_dtype));
  for (const auto& d : {d_k, d_v}) {
    d->set_output(true)
        .set_dim(bhsd(s, s.kv_heads))
        .set_stride(bshd_strides(s, s.kv_heads))
        .set_data_type(cudnn_type(a.grad_dtype));
  }
  for (const auto& amax : {amax_dq, amax_dk, amax_dv, amax_dp}) scalar_output(amax);
  b.build(handle, "sdpa_fp8_backward");
  b.pack = {{q, a.q.data.data_ptr()},
            {k, a.k.data.data_ptr()},
            {v, a.v.data.data_ptr()},
            {o, a.o.data_ptr()},
            {d_o, a.d_o.data.data_ptr()},
            {stats, a.stats.data_ptr()},
            {descale_q, a.q.descale.data_ptr()},
            {descale_k, a.k.descale.data_ptr()},
            {descale_v, a.v.descale.data_ptr()},
            {descale_o, a.descale_o.data_ptr()},
            {descale_do, a.d_o.descale.data_ptr()},
            {descale_s, a.descale_s.data_ptr()},
            {descale_dp, a.descale_dp.data_ptr()},
            {scale_s, a.scale_s.data_ptr()},
            {scale_dq, a.scale_dq.data_ptr()},
            {scale_dk, a.scale_dk.data_ptr()},
            {scale_dv, a.scale_dv.data_ptr()},
            {scale_dp, a.scale_dp.data_ptr()},
            {d_q, a.d_q.data_ptr()},
            {d_k, a.d_k.data_ptr()},
            {d_v, a.d_v.data_ptr()},
            {amax_dq, a.amax_dq.data_ptr()},
            {amax_dk, a.amax_dk.data_ptr()},
            {amax_dv, a.amax_dv.data_ptr()},
            {amax_dp, a.amax_dp.data_ptr()}};
  return b;
}

/// An empty tensor of `heads` heads in the BSHD memory the graphs describe.
at::Tensor bshd_empty(const Shape& s, int64_t heads, at::ScalarType dtype) {
  return torch::empty({s.batch, s.seq, heads, s.head_dim}, torch::TensorOptions(torch::kCUDA).dtype(dtype))
      .permute({0, 2, 1, 3});
}

/// A scale that maps `amax` onto the FP8 type's largest value, and its inverse.
void set_scale(at::Tensor& scale, at::Tensor& descale, const at::Tensor& amax, at::ScalarType dtype) {
  const double value = fp8_max(dtype) / std::max(amax.item<double>(), 1e-12);
  scale.fill_(value);
  descale.fill_(1.0 / value);
}

/// {largest difference / largest reference element, norm of the difference / norm of the reference}.
std::pair<double, double> errors(const at::Tensor& value, const at::Tensor& reference) {
  const at::Tensor v = value.to(torch::kFloat), r = reference.to(torch::kFloat);
  return {((v - r).abs().max() / r.abs().max().clamp_min(1e-30)).item<double>(),
          ((v - r).norm() / r.norm().clamp_min(1e-30)).item<double>()};
}

/// The dequantized value of an FP8 (or bf16) result.
at::Tensor dequantized(const at::Tensor& t, const at::Tensor& descale) {
  return t.scalar_type() == at::kBFloat16 ? t.to(torch::kFloat) : t.to(torch::kFloat) * descale;
}

}  // namespace

int main(int argc, char** argv) try {
  examples::Flags flags("sdpa_fp8_bench", "cuDNN's FP8 attention against ATen's bf16 SDPA, forward and backward");
  flags
      .add("shape", "tinyllama",
           "tinyllama (32 heads, 4 key/value heads, head dim 64, 4 x 2048) or llama2-7b "
           "(32 heads, 32 key/value heads, head dim 128, 1 x 4096)")
      .add("batch", "", "sequences (default: the shape's)")
      .add("seq", "", "sequence length (default: the shape's)")
      .add("iterations", "20", "calls per timed trial")
      .add("trials", "5", "trials; the best counts")
      .add("json", "", "append one JSON line with the results to this file");
  flags.parse(argc, argv);
  Shape s = flags.str("shape") == "llama2-7b" ? Shape{1, 32, 32, 4096, 128} : Shape{4, 32, 4, 2048, 64};
  if (flags.str("shape") != "tinyllama" && flags.str("shape") != "llama2-7b") {
    flags.fail("--shape takes tinyllama or llama2-7b; got '" + flags.str("shape") + "'");
  }
  if (flags.given("batch")) s.batch = flags.integer("batch");
  if (flags.given("seq")) s.seq = flags.integer("seq");
  const int iterations = static_cast<int>(flags.integer("iterations"));
  const int trials = static_cast<int>(flags.integer("trials"));
  const bench::RunInfo info = bench::run_info(0);
  fmt::print("{} | {} | cuDNN {} | cudnn-frontend {} | commit {}\n", info.gpu, info.date, cudnnGetVersion(),
             CUDNN_FRONTEND_VERSION, info.commit);
  fmt::print("batch {} x seq {}, {} heads, {} key/value heads, head dim {}, causal\n", s.batch, s.seq, s.heads,
             s.kv_heads, s.head_dim);
  torch::manual_seed(0);
  const float attn_scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));

  // The bf16 reference, under autograd as the example runs it.
  const at::Tensor q = activation(s, s.heads, 1.0).requires_grad_();
  const at::Tensor k = activation(s, s.kv_heads, 1.0).requires_grad_();
  const at::Tensor v = activation(s, s.kv_heads, 1.0).requires_grad_();
  const at::Tensor d_o = activation(s, s.heads, 1e-3);
  auto attention = [&] {
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, attn_scale, /*enable_gqa=*/true);
  };
  const at::Tensor o_ref = attention();
  const auto grads_ref = torch::autograd::grad({o_ref}, {q, k, v}, {d_o}, /*retain_graph=*/true);
  const double bf16_forward_ms = bench::best_ms_per_call(iterations, trials, [&] { attention(); });
  const double bf16_backward_ms = bench::best_ms_per_call(iterations, trials, [&] {
    torch::autograd::grad({o_ref}, {q, k, v}, {d_o}, /*retain_graph=*/true);
  });
  fmt::print("bf16 (ATen SDPA): forward {:.3f} ms ({:.0f} TFLOP/s), backward {:.3f} ms ({:.0f} TFLOP/s)\n",
             bf16_forward_ms, s.forward_flops() / bf16_forward_ms / 1e9, bf16_backward_ms,
             s.backward_flops() / bf16_backward_ms / 1e9);

  // FP8: the first variant cuDNN builds, in order of preference.
  cudnnHandle_t handle = at::native::getCudnnHandle();
  std::string notes, variant;
  Fp8Attention a;
  Built forward, backward;
  bool built = false;
  for (const auto& [o_dtype, d_o_dtype, grad_dtype] :
       {std::tuple{at::kFloat8_e4m3fn, at::kFloat8_e5m2, at::kBFloat16},
        std::tuple{at::kFloat8_e4m3fn, at::kFloat8_e4m3fn, at::kBFloat16},
        std::tuple{at::kFloat8_e4m3fn, at::kFloat8_e5m2, at::kFloat8_e5m2},
        std::tuple{at::kFloat8_e4m3fn, at::kFloat8_e4m3fn, at::kFloat8_e4m3fn}}) {
    variant = fmt::format("O {}, dO {}, dQ/dK/dV {}", c10::toString(o_dtype), c10::toString(d_o_dtype),
                          c10::toString(grad_dtype));
    try {
      a = Fp8Attention{};
      a.o_dtype = o_dtype;
      a.grad_dtype = grad_dtype;
      a.q = to_fp8(q.detach(), at::kFloat8_e4m3fn);
      a.k = to_fp8(k.detach(), at::kFloat8_e4m3fn);
      a.v = to_fp8(v.detach(), at::kFloat8_e4m3fn);
      a.d_o = to_fp8(d_o, d_o_dtype);
      a.o = bshd_empty(s, s.heads, o_dtype);
      a.stats = torch::empty({s.batch, s.heads, s.seq, 1}, torch::TensorOptions(torch::kCUDA));
      a.d_q = bshd_empty(s, s.heads, grad_dtype);
      a.d_k = bshd_empty(s, s.kv_heads, grad_dtype);
      a.d_v = bshd_empty(s, s.kv_heads, grad_dtype);
      forward = forward_graph(s, a, attn_scale, handle);
      backward = backward_graph(s, a, attn_scale, handle);
      built = true;
      break;
    } catch (const std::exception& e) {
      notes += fmt::format("- {}: {}\n", variant, e.what());
    }
  }
  if (!built) {
    fmt::print("fp8: no variant builds on this cuDNN and GPU:\n{}", notes);
    return 1;
  }
  if (!notes.empty()) fmt::print("fp8 variants cuDNN refused first:\n{}", notes);

  // Calibration: the scales of S, O, dP (and FP8 gradients) from one run's amaxes.
  set_scale(a.scale_s, a.descale_s, scalar(1.0), at::kFloat8_e4m3fn);  // probabilities are at most 1
  forward.run(handle, "sdpa_fp8");
  set_scale(a.scale_o, a.descale_o, a.amax_o, a.o_dtype);
  forward.run(handle, "sdpa_fp8");
  backward.run(handle, "sdpa_fp8_backward");
  set_scale(a.scale_dp, a.descale_dp, a.amax_dp, at::kFloat8_e5m2);
  if (a.grad_dtype != at::kBFloat16) {
    at::Tensor unused = scalar(1);
    set_scale(a.scale_dq, unused, a.amax_dq, a.grad_dtype);
    set_scale(a.scale_dk, unused, a.amax_dk, a.grad_dtype);
    set_scale(a.scale_dv, unused, a.amax_dv, a.grad_dtype);
  }
  backward.run(handle, "sdpa_fp8_backward");
  if (const cudaError_t error = cudaDeviceSynchronize(); error != cudaSuccess) {
    throw std::runtime_error(std::string("the FP8 graphs failed on the device: ") + cudaGetErrorString(error));
  }

  const auto [o_max, o_norm] = errors(dequantized(a.o, a.descale_o), o_ref.detach());
  auto gradient_errors = [&](const at::Tensor& fp8, const at::Tensor& scale, const at::Tensor& reference) {
    return errors(dequantized(fp8, 1.0 / scale), reference);
  };
  const auto [dq_max, dq_norm] = gradient_errors(a.d_q, a.scale_dq, grads_ref[0]);
  const auto [dk_max, dk_norm] = gradient_errors(a.d_k, a.scale_dk, grads_ref[1]);
  const auto [dv_max, dv_norm] = gradient_errors(a.d_v, a.scale_dv, grads_ref[2]);

  const double fp8_forward_ms = bench::best_ms_per_call(iterations, trials, [&] { forward.run(handle, "sdpa_fp8"); });
  const double fp8_backward_ms =
      bench::best_ms_per_call(iterations, trials, [&] { backward.run(handle, "sdpa_fp8_backward"); });
  fmt::print("fp8 ({}): forward {:.3f} ms ({:.0f} TFLOP/s), backward {:.3f} ms ({:.0f} TFLOP/s)\n", variant,
             fp8_forward_ms, s.forward_flops() / fp8_forward_ms / 1e9, fp8_backward_ms,
             s.backward_flops() / fp8_backward_ms / 1e9);
  fmt::print("fp8 / bf16 time: forward {:.3f}, backward {:.3f}, both {:.3f}\n", fp8_forward_ms / bf16_forward_ms,
             fp8_backward_ms / bf16_backward_ms,
             (fp8_forward_ms + fp8_backward_ms) / (bf16_forward_ms + bf16_backward_ms));
  fmt::print(
      "fp8 against bf16 (largest difference / largest element, norm of the difference / norm): O {:.3g} {:.3g}, "
      "dQ {:.3g} {:.3g}, dK {:.3g} {:.3g}, dV {:.3g} {:.3g}\n",
      o_max, o_norm, dq_max, dq_norm, dk_max, dk_norm, dv_max, dv_norm);

  if (!flags.str("json").empty()) {
    std::ofstream json(flags.str("json"), std::ios::app);
    json << fmt::format(
        "{{\"gpu\": \"{}\", \"date\": \"{}\", \"commit\": \"{}\", \"cudnn\": {}, \"batch\": {}, \"seq\": {}, "
        "\"heads\": {}, \"kv_heads\": {}, \"head_dim\": {}, \"fp8_variant\": \"{}\", \"bf16_forward_ms\": {:.4f}, "
        "\"bf16_backward_ms\": {:.4f}, \"fp8_forward_ms\": {:.4f}, \"fp8_backward_ms\": {:.4f}, "
        "\"o_error\": [{:.4g}, {:.4g}], \"dq_error\": [{:.4g}, {:.4g}], \"dk_error\": [{:.4g}, {:.4g}], "
        "\"dv_error\": [{:.4g}, {:.4g}]}}\n",
        info.gpu, info.date, info.commit, cudnnGetVersion(), s.batch, s.seq, s.heads, s.kv_heads, s.head_dim, variant,
        bf16_forward_ms, bf16_backward_ms, fp8_forward_ms, fp8_backward_ms, o_max, o_norm, dq_max, dq_norm, dk_max,
        dk_norm, dv_max, dv_norm);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "sdpa_fp8_bench: %s\n", e.what());
  return 1;
}
