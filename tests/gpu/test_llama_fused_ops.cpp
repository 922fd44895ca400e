// The LLaMA decoder's fused CUDA kernels (examples/llama/fused_kernels.cu)
// against the ATen ops they replace: values and gradients, in every dtype
// the model runs them in, vectorized and not, and the whole model under
// bf16 autocast (its RMSNorm is libddp's, tested in test_rms_norm.cpp).

#include <cstdio>
#include <string>
#include <tuple>

#include <c10/cuda/CUDACachingAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "fused_ops.h"
#include "llama_model.h"
#include "support/float8_gpu.h"
#include "support/fused_comparison.h"
#include "support/relative_error.h"

namespace {

using ddp::testing::expect_fused_matches_aten;
using ddp::testing::expect_not_differentiable_twice;
using ddp::testing::fused_tolerance;
using ddp::testing::relative_error;

const torch::Device kGpu(torch::kCUDA, 0);

TEST(LlamaFusedOps, AreBuilt) { EXPECT_TRUE(llama::ops::fused_kernels_built()); }

TEST(LlamaFusedOps, CrossEntropyMatchesAten) {
  // 32000 classes: the vectorized kernels; 1001: the scalar ones. Some
  // targets are ignored (-100), which leaves them out of the mean.
  for (const std::int64_t vocab : {32000, 1001}) {
    for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
      torch::manual_seed(8);
      const std::int64_t rows = 1500;
      const auto logits = (3 * torch::randn({rows, vocab}, torch::TensorOptions().device(kGpu))).to(dtype);
      auto targets = torch::randint(0, vocab, {rows}, torch::TensorOptions().device(kGpu).dtype(torch::kLong));
      targets.index_put_({torch::indexing::Slice(0, rows, 7)}, -100);
      const std::string what = "cross_entropy " + std::string(c10::toString(dtype)) + " vocab " + std::to_string(vocab);
      torch::Tensor losses[2], grads[2];
      for (const bool fused : {false, true}) {
        const auto leaf = logits.clone().requires_grad_();
        losses[fused] = llama::ops::cross_entropy(leaf, targets, fused);
        losses[fused].backward(torch::full({}, 0.37, losses[fused].options()));
        grads[fused] = leaf.grad();
      }
      ASSERT_EQ(losses[1].scalar_type(), torch::kFloat) << what;
      ASSERT_EQ(grads[1].scalar_type(), dtype) << what;
      const double loss_error = relative_error(losses[1], losses[0]);
      const double grad_error = relative_error(grads[1], grads[0]);
      std::printf("%s: loss %.6f, relative error %.3g, gradient %.3g\n", what.c_str(), losses[0].item<double>(),
                  loss_error, grad_error);
      EXPECT_LT(loss_error, 1e-5) << what;
      EXPECT_LT(grad_error, fused_tolerance(dtype) * 2) << what;
      // Ignored rows have no gradient.
      EXPECT_EQ(grads[1].index({torch::indexing::Slice(0, rows, 7)}).abs().max().item<double>(), 0) << what;
    }
  }
}

TEST(LlamaFusedOps, RotationMatchesAten) {
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    torch::manual_seed(3);
    const std::int64_t seq = 300, heads = 6, head_dim = 64;
    const auto angles = torch::randn({seq, head_dim / 2}, torch::TensorOptions().device(kGpu)) * 3;
    const auto x = torch::randn({3, seq, heads, head_dim}, torch::TensorOptions().device(kGpu)).to(dtype);
    expect_fused_matches_aten(
        {x},
        [&](const std::vector<torch::Tensor>& in, bool fused) {
          return llama::ops::rotate_pairs(in[0], angles.cos(), angles.sin(), fused);
        },
        dtype, "rotate_pairs " + std::string(c10::toString(dtype)));
  }
}

// One kernel splits a q/k/v projection's output and rotates q and k, and
// one writes its gradient whole; TinyLlama's heads (32 and 4 of 64) and an
// odd small shape (3 and 1 of 8).
TEST(LlamaFusedOps, SplitRotateQkvMatchesAten) {
  for (const auto& [heads, kv_heads, head_dim] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{32, 4, 64},
                                                  std::tuple<std::int64_t, std::int64_t, std::int64_t>{3, 1, 8}}) {
    for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
      torch::manual_seed(3);
      const std::int64_t seq = 130;
      const auto angles = torch::randn({seq, head_dim / 2}, torch::TensorOptions().device(kGpu)) * 3;
      const auto qkv =
          torch::randn({2, seq, (heads + 2 * kv_heads) * head_dim}, torch::TensorOptions().device(kGpu)).to(dtype);
      expect_fused_matches_aten(
          {qkv},
          [&, heads = heads, kv_heads = kv_heads](const std::vector<torch::Tensor>& in, bool fused) {
            const auto [q, k, v] =
                llama::ops::split_rotate_qkv(in[0], angles.cos(), angles.sin(), heads, kv_heads, fused);
            // The fused call must have run the kernels, not the ATen ops it is compared with.
            EXPECT_EQ(fused, q.grad_fn()->name().find("FusedSplitRotateQkv") != std::string::npos)
                << q.grad_fn()->name();
            return torch::cat({q.flatten(), k.flatten(), v.flatten()});
          },
          dtype, "split_rotate_qkv " + std::string(c10::toString(dtype)) + " " + std::to_string(heads) + " heads");
    }
  }
}

/// With the projection whose output qkv is, running FP8 with delayed
/// scaling: the merged gradient is written as the projection's FP8 output
/// gradient (ddp::float8::output_gradient_destination), the same bytes the
/// projection's own cast of the bf16 gradient makes, so every gradient is
/// equal bit for bit to the path without it, over steps whose scales follow
/// the amaxes.
TEST(LlamaFusedOps, SplitRotateQkvWritesTheProjectionsFloat8GradientAsItsCastWould) {
  DDP_SKIP_WITHOUT_FLOAT8();
  const std::int64_t heads = 4, kv_heads = 2, head_dim = 64, seq = 64, dim = 256;
  const auto on_gpu = torch::TensorOptions().device(kGpu);
  const auto options = ddp::Float8Options().scaling(ddp::Float8Scaling::kDelayed).amax_history_len(4);
  torch::manual_seed(9);
  ddp::Float8Linear projection[2]{nullptr, nullptr};  // [0]: merged in bf16 and cast by the layer, [1]: in FP8
  for (auto& layer : projection) {
    layer = ddp::Float8Linear(torch::nn::LinearOptions(dim, (heads + 2 * kv_heads) * head_dim).bias(false), options);
    layer->to(kGpu);
  }
  {
    torch::NoGradGuard no_grad;
    projection[1]->weight.copy_(projection[0]->weight);
  }
  const auto angles = torch::randn({seq, head_dim / 2}, on_gpu) * 3;
  for (int step = 0; step < 3; ++step) {
    const std::string at = "step " + std::to_string(step);
    const auto x = torch::randn({2, seq, dim}, on_gpu.dtype(torch::kBFloat16)) * (step + 1);
    const auto grad_q = torch::randn({2, seq, heads, head_dim}, on_gpu) * 1e-2;
    const auto grad_k = torch::randn({2, seq, kv_heads, head_dim}, on_gpu) * 1e-2;
    const auto grad_v = torch::randn({2, seq, kv_heads, head_dim}, on_gpu) * 1e-2;
    torch::Tensor inputs[2];
    for (int fp8 = 0; fp8 < 2; ++fp8) {
      inputs[fp8] = x.clone().requires_grad_();
      const torch::Tensor qkv = projection[fp8](inputs[fp8]);
      torch::Tensor grad_qkv;
      qkv.register_hook([&grad_qkv](const torch::Tensor& grad) { grad_qkv = grad; });
      const auto [q, k, v] = llama::ops::split_rotate_qkv(qkv, angles.cos(), angles.sin(), heads, kv_heads,
                                                          /*fused=*/true, fp8 ? projection[1].get() : nullptr);
      ((q.to(torch::kFloat) * grad_q).sum() + (k.to(torch::kFloat) * grad_k).sum() +
       (v.to(torch::kFloat) * grad_v).sum())
          .backward();
      ASSERT_TRUE(grad_qkv.defined()) << at;
      // The FP8 path hands autograd a tensor without values (zero strides) in the gradient's place.
      EXPECT_EQ(grad_qkv.stride(0) == 0, fp8 == 1)
          << at << ": the FP8 gradient was " << (fp8 ? "not " : "") << "written";
    }
    EXPECT_TRUE(torch::equal(inputs[1].grad(), inputs[0].grad())) << at << ": the projection's input gradient";
    EXPECT_TRUE(torch::equal(projection[1]->weight.grad(), projection[0]->weight.grad()))
        << at << ": the projection's weight gradient";
    const auto amaxes = std::make_pair(projection[0]->latest_amaxes(), projection[1]->latest_amaxes());
    EXPECT_TRUE(torch::equal(amaxes.second[2], amaxes.first[2])) << at << ": the output gradient's amax";
    for (auto& layer : projection) layer->weight.mutable_grad().reset();
  }
}

TEST(LlamaFusedOps, SwigluMatchesAten) {
  // 4096 x 5632 elements: vectorized; 1001 x 7: scalar.
  for (const auto& shape : {std::vector<std::int64_t>{4096, 5632}, std::vector<std::int64_t>{1001, 7}}) {
    for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
      torch::manual_seed(4);
      const auto gate = (2 * torch::randn(shape, torch::TensorOptions().device(kGpu))).to(dtype);
      const auto up = torch::randn(shape, torch::TensorOptions().device(kGpu)).to(dtype);
      expect_fused_matches_aten(
          {gate, up},
          [](const std::vector<torch::Tensor>& in, bool fused) { return llama::ops::swiglu(in[0], in[1], fused); },
          dtype, "swiglu " + std::string(c10::toString(dtype)) + " " + std::to_string(shape[1]));
    }
  }
}

/// What the fused ops owe autograd beyond their values, as the ATen ops give
/// it: a gradient for rotation angles that need one (through the ATen ops),
/// and for gradients of gradients an error instead of silently missing terms.
TEST(LlamaFusedOps, BehaveUnderAutogradAsTheAtenOps) {
  const auto options = torch::TensorOptions().device(kGpu);
  torch::manual_seed(8);
  torch::Tensor grads[2];
  const auto angles = torch::randn({8, 4}, options).requires_grad_();
  const auto q = torch::randn({2, 8, 3, 8}, options);
  const auto weights = torch::randn({2, 8, 3, 8}, options);
  for (const bool fused : {false, true}) {
    const auto rotated = llama::ops::rotate_pairs(q, angles.cos(), angles.sin(), fused);
    grads[fused] = torch::autograd::grad({(rotated * weights).sum()}, {angles})[0];
  }
  ASSERT_TRUE(grads[1].defined());
  EXPECT_LT(relative_error(grads[1], grads[0]), 1e-6) << "gradient of the rotation angles";

  const auto gate = torch::randn({4, 8}, options).requires_grad_();
  const auto up = torch::randn({4, 8}, options).requires_grad_();
  const auto k = torch::randn({2, 8, 3, 8}, options).requires_grad_();
  const auto cos = angles.detach().cos(), sin = angles.detach().sin();
  const std::tuple<const char*, torch::Tensor, torch::Tensor> cases[] = {
      {"rotate_pairs", llama::ops::rotate_pairs(k, cos, sin, true), k},
      {"swiglu", llama::ops::swiglu(gate, up, true), gate}};
  for (const auto& [name, output, input] : cases) expect_not_differentiable_twice(output, input, name);
}

/// The tiny preset widened to dim 256 (FFN 704), with `heads` query and
/// `kv_heads` key/value heads over sequences of `seq` tokens.
llama::LlamaConfig small_decoder(std::int64_t heads, std::int64_t kv_heads, std::int64_t seq) {
  llama::LlamaConfig config = llama::LlamaConfig::preset("tiny");
  config.dim = 256;
  config.n_heads = heads;
  config.n_kv_heads = kv_heads;
  config.ffn_hidden = 704;
  config.max_seq_len = seq;
  return config;
}

/// SDPA on CUDA takes grouped key/value heads only in its flash kernel (16-bit)
/// and its math kernel, which keeps every block's [batch, heads, seq, seq]
/// attention weights for backward. An fp32 decoder with grouped heads must
/// still train in the memory of the memory-efficient kernel: 2 blocks of 32
/// heads over 2,048 tokens would keep 512 MiB of weights each.
TEST(LlamaFusedOps, Fp32GroupedHeadsKeepNoSequenceBySequenceWeights) {
  const llama::LlamaConfig config = small_decoder(/*heads=*/32, /*kv_heads=*/4, /*seq=*/2048);
  torch::manual_seed(5);
  llama::Llama model(config);
  model->to(kGpu);
  const auto tokens = torch::randint(config.vocab_size, {1, config.max_seq_len},
                                     torch::TensorOptions().device(kGpu).dtype(torch::kLong));
  torch::cuda::synchronize();
  const std::int64_t before = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current;
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  const torch::Tensor logits = model(tokens);
  llama::ops::cross_entropy(logits.flatten(0, 1), tokens.flatten(), /*fused=*/true).backward();
  torch::cuda::synchronize();
  const std::int64_t step_bytes = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].peak - before;
  const std::int64_t weights_bytes = config.n_heads * config.max_seq_len * config.max_seq_len * 4;
  std::printf("fp32 step over %lld tokens: %.1f MiB above the model, one block's attention weights %.1f MiB\n",
              static_cast<long long>(config.max_seq_len), step_bytes / 1048576.0, weights_bytes / 1048576.0);
  EXPECT_LT(step_bytes, weights_bytes / 2);
}

/// The whole decoder, fused against unfused, in bf16: logits, loss and every
/// parameter's gradient.
TEST(LlamaFusedOps, DecoderMatchesTheAtenDecoderUnderBf16) {
  llama::LlamaConfig config = small_decoder(/*heads=*/4, /*kv_heads=*/2, /*seq=*/128);
  torch::manual_seed(5);
  const auto tokens =
      torch::randint(config.vocab_size, {4, 128}, torch::TensorOptions().device(kGpu).dtype(torch::kLong));
  torch::Tensor logits[2];
  std::vector<torch::Tensor> grads[2];
  for (const bool fused : {false, true}) {
    // Fused: every fusion the decoder has (the residual add in the norm,
    // fp32 weight gradients, the fused loss); else the reference's ops.
    config.fused_kernels = fused;
    config.fp32_weight_gradients = fused;
    torch::manual_seed(6);
    llama::Llama model(config);
    model->to(kGpu);
    torch::Tensor loss;
    {
      ddp::PrecisionGuard guard(ddp::PrecisionPolicy::parse("bf16"), kGpu);
      logits[fused] = model(tokens);
      loss = llama::ops::cross_entropy(logits[fused].flatten(0, 1), tokens.flatten(), fused);
    }
    loss.backward();
    for (const auto& p : model->parameters()) grads[fused].push_back(p.grad());
  }
  const double logit_error = relative_error(logits[1], logits[0]);
  std::printf("decoder: logits relative error %.3g\n", logit_error);
  EXPECT_LT(logit_error, 2e-2);
  double worst = 0;
  for (std::size_t i = 0; i < grads[0].size(); ++i) worst = std::max(worst, relative_error(grads[1][i], grads[0][i]));
  std::printf("decoder: largest gradient relative error %.3g over %zu parameters\n", worst, grads[0].size());
  EXPECT_LT(worst, 5e-2);
}

}  // namespace
