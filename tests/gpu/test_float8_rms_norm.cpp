// float8::rms_norm and float8::add_rms_norm: the norm writing the FP8 cast of
// the layer after it gives what the layer computes from ddp::rms_norm's
// output (forward, every gradient, the amax the layer's history takes), and
// falls back to ddp::rms_norm where it cannot fuse.

#include <cstdio>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "float8/linear_state.h"
#include "support/relative_error.h"

namespace {

const torch::Device kGpu(torch::kCUDA, 0);
using ddp::testing::relative_error;

ddp::Float8Options delayed() { return ddp::Float8Options().scaling(ddp::Float8Scaling::kDelayed).amax_history_len(4); }

struct Case {
  bool residual;
  torch::ScalarType stream_dtype;  // x's; the norm returns bf16 (autocast for fp32)
  std::int64_t rows;               // 48: a last strip of 16 rows
};

class Float8RmsNorm : public ::testing::TestWithParam<Case> {};

TEST_P(Float8RmsNorm, WritesTheCastTheLayerWouldMake) {
  const Case c = GetParam();
  const std::string what = std::string(c.residual ? "add_rms_norm" : "rms_norm") + " of " +
                           c10::toString(c.stream_dtype) + ", " + std::to_string(c.rows) + " rows";
  torch::manual_seed(21);
  const std::int64_t cols = 272;  // 17 x 16: not a multiple of the 32 columns a warp reads at once
  const auto on_gpu = torch::TensorOptions().device(kGpu);
  ddp::Float8Linear own(torch::nn::LinearOptions(cols, 64).bias(false), delayed());
  ddp::Float8Linear fused(torch::nn::LinearOptions(cols, 64).bias(false), delayed());
  own->to(kGpu);
  fused->to(kGpu);
  const auto norm_weight = torch::rand({cols}, on_gpu) + 0.5;
  {
    torch::NoGradGuard no_grad;
    fused->weight.copy_(own->weight);
  }
  // An fp32 stream runs under bf16 autocast, as LLaMA's, so that the norm returns bf16.
  const ddp::AutocastState autocast{c.stream_dtype == torch::kFloat, torch::kBFloat16};
  for (int step = 0; step < 3; ++step) {
    const std::string at = what + ", step " + std::to_string(step);
    // [batch, seq, features], as a model's activations: the norm works on their rows.
    const std::vector<std::int64_t> sizes{2, c.rows / 2, cols};
    const auto x = (torch::randn(sizes, on_gpu) * (step + 1)).to(c.stream_dtype);
    const auto delta = torch::randn(sizes, on_gpu.dtype(torch::kBFloat16));
    const auto grad_output = torch::randn({2, c.rows / 2, 64}, on_gpu.dtype(torch::kBFloat16)) * 1e-2;
    const auto grad_h = torch::randn(sizes, on_gpu.dtype(c.stream_dtype)) * 1e-2;

    std::vector<torch::Tensor> leaves[2], outputs[2], sums[2];
    for (const bool fusing : {false, true}) {
      auto& leaf = leaves[fusing];
      leaf = {x.clone().requires_grad_(), delta.clone().requires_grad_(), norm_weight.clone().requires_grad_()};
      torch::Tensor h, normed;
      {
        const ddp::AutocastStateGuard guard(c10::DeviceType::CUDA, autocast);
        if (c.residual) {
          std::tie(h, normed) = fusing ? ddp::float8::add_rms_norm(leaf[0], leaf[1], leaf[2], *fused)
                                       : ddp::add_rms_norm(leaf[0], leaf[1], leaf[2]);
        } else {
          normed = fusing ? ddp::float8::rms_norm(leaf[0], leaf[2], *fused) : ddp::rms_norm(leaf[0], leaf[2]);
        }
        if (fusing) {
          ASSERT_EQ(normed.stride(0), 0) << at << ": the fused path did not run (the output holds values)";
        }
        EXPECT_EQ(normed.scalar_type(), torch::kBFloat16) << at;
        outputs[fusing] = {(fusing ? fused : own)(normed)};
      }
      torch::Tensor loss = (outputs[fusing][0].to(torch::kFloat) * grad_output.to(torch::kFloat)).sum();
      if (c.residual) {
        sums[fusing] = {h.detach()};
        loss = loss + (h.to(torch::kFloat) * grad_h.to(torch::kFloat)).sum();
      }
      loss.backward();
    }
    if (c.residual) {
      EXPECT_TRUE(torch::equal(sums[1][0], sums[0][0])) << at << ": x + delta";
    }
    // The two norms sum the squares in different orders: the rsqrt may differ
    // in its last bit, and an FP8 value by one step where that tips a rounding.
    EXPECT_LT(relative_error(outputs[1][0].detach(), outputs[0][0].detach()), 1e-2) << at << ": layer output";
    for (int i = 0; i < 3; ++i) {
      if (i == 1 && !c.residual) continue;
      ASSERT_TRUE(leaves[1][i].grad().defined()) << at << ": gradient " << i;
      EXPECT_LT(relative_error(leaves[1][i].grad(), leaves[0][i].grad()), 2e-2) << at << ": gradient " << i;
    }
    EXPECT_LT(relative_error(fused->weight.grad(), own->weight.grad()), 2e-2) << at << ": layer weight gradient";
    const auto own_amaxes = own->latest_amaxes();
    const auto fused_amaxes = fused->latest_amaxes();
    EXPECT_LT(relative_error(fused_amaxes[0], own_amaxes[0]), 1e-2) << at << ": input amax";
    own->weight.mutable_grad().reset();
    fused->weight.mutable_grad().reset();
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Float8RmsNorm,
                         ::testing::Values(Case{true, torch::kFloat, 128}, Case{true, torch::kBFloat16, 48},
                                           Case{false, torch::kFloat, 48}, Case{false, torch::kBFloat16, 128}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.residual ? "Add" : "") + "RmsNormOf" +
                                  (info.param.stream_dtype == torch::kFloat ? "Fp32" : "Bf16") + "Rows" +
                                  std::to_string(info.param.rows);
                         });

TEST(Float8RmsNormFallback, RunsTheUnfusedNormWhereTheLayerCannotTakeTheCast) {
  torch::manual_seed(22);
  const auto on_gpu = torch::TensorOptions().device(kGpu).dtype(torch::kBFloat16);
  ddp::Float8Linear current(torch::nn::LinearOptions(64, 32), ddp::Float8Options());
  // A group one of whose layers runs bf16: that layer would read the placeholder's values.
  ddp::Float8Linear shared_a(torch::nn::LinearOptions(64, 32), delayed());
  ddp::Float8Linear shared_b(torch::nn::LinearOptions(64, 32), delayed());
  ddp::float8::share_input_cast({shared_a.get(), shared_b.get()});
  shared_b->set_float8_enabled(false);
  ddp::Float8Linear delayed_layer(torch::nn::LinearOptions(64, 32), delayed());
  ddp::Float8Linear narrower(torch::nn::LinearOptions(32, 32), delayed());
  for (auto* layer : {current.get(), shared_a.get(), shared_b.get(), delayed_layer.get(), narrower.get()}) {
    layer->to(kGpu);
  }
  const auto weight = torch::rand({64}, on_gpu.dtype(torch::kFloat));
  const auto x = torch::randn({32, 64}, on_gpu);
  const auto rows24 = x.narrow(0, 0, 24);
  const auto unfused = ddp::RMSNormOptions().fused(false);
  struct Fallback {
    const char* why;
    torch::Tensor normed, expected;
  };
  const Fallback fallbacks[] = {
      {"current scaling", ddp::float8::rms_norm(x, weight, *current), ddp::rms_norm(x, weight)},
      {"a layer sharing its input cast with a bf16 layer", ddp::float8::rms_norm(x, weight, *shared_a),
       ddp::rms_norm(x, weight)},
      {"rows not a multiple of 16", ddp::float8::rms_norm(rows24, weight, *delayed_layer),
       ddp::rms_norm(rows24, weight)},
      {"fused(false)", ddp::float8::rms_norm(x, weight, *delayed_layer, unfused), ddp::rms_norm(x, weight, unfused)},
      {"a layer of another width", ddp::float8::rms_norm(x, weight, *narrower), ddp::rms_norm(x, weight)},
  };
  for (const Fallback& fallback : fallbacks) {
    ASSERT_NE(fallback.normed.stride(0), 0) << fallback.why << ": the norm must return its values";
    EXPECT_TRUE(torch::equal(fallback.normed, fallback.expected)) << fallback.why;
  }
}

/// A norm read by two layers that share one input cast (SwiGLU's gate and
/// up): the norm writes the cast for the first layer it is given, and both
/// layers take it, whichever runs first; forward and every gradient as the
/// unfused norm's, whose output the group casts itself, over three steps.
TEST(Float8RmsNormSharedCast, EveryLayerOfTheGroupTakesTheNormsCastInEitherOrder) {
  const std::int64_t cols = 256, hidden = 96;
  const auto on_gpu = torch::TensorOptions().device(kGpu);
  for (const bool gate_first : {true, false}) {
    torch::manual_seed(24);
    const std::string order = gate_first ? "gate first" : "up first";
    ddp::Float8Linear gate[2]{nullptr, nullptr}, up[2]{nullptr, nullptr};  // [0]: unfused norm, [1]: fused
    for (int fusing = 0; fusing < 2; ++fusing) {
      gate[fusing] = ddp::Float8Linear(torch::nn::LinearOptions(cols, hidden).bias(false), delayed());
      up[fusing] = ddp::Float8Linear(torch::nn::LinearOptions(cols, hidden).bias(false), delayed());
      gate[fusing]->to(kGpu);
      up[fusing]->to(kGpu);
      ddp::float8::share_input_cast({gate[fusing].get(), up[fusing].get()});
    }
    {
      torch::NoGradGuard no_grad;
      gate[1]->weight.copy_(gate[0]->weight);
      up[1]->weight.copy_(up[0]->weight);
    }
    const auto norm_weight = torch::rand({cols}, on_gpu) + 0.5;
    for (int step = 0; step < 3; ++step) {
      const std::string at = order + ", step " + std::to_string(step);
      const std::vector<std::int64_t> sizes{2, 32, cols};
      const auto x = torch::randn(sizes, on_gpu.dtype(torch::kBFloat16)) * (step + 1);
      const auto delta = torch::randn(sizes, on_gpu.dtype(torch::kBFloat16));
      const auto grad_gate = torch::randn({2, 32, hidden}, on_gpu) * 1e-2;
      const auto grad_up = torch::randn({2, 32, hidden}, on_gpu) * 1e-2;
      std::vector<torch::Tensor> leaves[2], outputs[2];
      for (const int fusing : {0, 1}) {
        auto& leaf = leaves[fusing];
        leaf = {x.clone().requires_grad_(), delta.clone().requires_grad_(), norm_weight.clone().requires_grad_()};
        const auto [h, normed] = fusing ? ddp::float8::add_rms_norm(leaf[0], leaf[1], leaf[2], *gate[fusing])
                                        : ddp::add_rms_norm(leaf[0], leaf[1], leaf[2]);
        if (fusing) {
          ASSERT_EQ(normed.stride(0), 0) << at << ": the fused path did not run (the output holds values)";
        }
        torch::Tensor gate_out, up_out;
        if (gate_first) {
          gate_out = gate[fusing](normed);
          up_out = up[fusing](normed);
        } else {
          up_out = up[fusing](normed);
          gate_out = gate[fusing](normed);
        }
        outputs[fusing] = {gate_out.detach(), up_out.detach()};
        ((gate_out.to(torch::kFloat) * grad_gate).sum() + (up_out.to(torch::kFloat) * grad_up).sum() +
         h.to(torch::kFloat).sum() * 1e-3)
            .backward();
      }
      // The unfused group casts with the scaling of the layer that runs
      // first, the fused norm with the gate's: the same scale at step 0, and
      // after it scales from the same amaxes (the norm's output's).
      for (int i = 0; i < 2; ++i) {
        EXPECT_LT(relative_error(outputs[1][i], outputs[0][i]), 1e-2) << at << ": output of " << (i ? "up" : "gate");
      }
      for (int i = 0; i < 3; ++i) {
        EXPECT_LT(relative_error(leaves[1][i].grad(), leaves[0][i].grad()), 2e-2) << at << ": gradient " << i;
      }
      EXPECT_LT(relative_error(gate[1]->weight.grad(), gate[0]->weight.grad()), 2e-2) << at << ": gate's weight";
      EXPECT_LT(relative_error(up[1]->weight.grad(), up[0]->weight.grad()), 2e-2) << at << ": up's weight";
      for (int fusing = 0; fusing < 2; ++fusing) {
        gate[fusing]->weight.mutable_grad().reset();
        up[fusing]->weight.mutable_grad().reset();
      }
    }
  }
}

/// A layer of the group handed the norm's placeholder a second time finds
/// no cast left for it, and the placeholder has no values to cast: a
/// UsageError, not a cast of uninitialised memory.
TEST(Float8RmsNormSharedCast, APlaceholderHandedToALayerTwiceIsRefused) {
  const auto on_gpu = torch::TensorOptions().device(kGpu);
  ddp::Float8Linear gate(torch::nn::LinearOptions(64, 32).bias(false), delayed());
  ddp::Float8Linear up(torch::nn::LinearOptions(64, 32).bias(false), delayed());
  gate->to(kGpu);
  up->to(kGpu);
  ddp::float8::share_input_cast({gate.get(), up.get()});
  const auto x = torch::randn({32, 64}, on_gpu.dtype(torch::kBFloat16));
  const auto normed = ddp::float8::rms_norm(x, torch::ones({64}, on_gpu), *gate);
  ASSERT_EQ(normed.stride(0), 0) << "the fused path did not run";
  up(normed);
  EXPECT_THROW(up(normed), ddp::UsageError);
  gate(normed);  // its own offer: still waiting
}

/// The FP8 bytes the norm writes against the cast of ddp::rms_norm's output
/// with the same scale: equal but where the two norms' sums of squares,
/// added in different orders, tip a rounding (rare, and by one FP8 step).
/// Widths past 48 KiB of shared memory a block (2048, 7168 columns: 66 and
/// 224 KiB), and one past what a block can have (8192), which falls back.
TEST(Float8RmsNormBytes, EqualTheCastOfTheUnfusedNorm) {
  for (const std::int64_t cols : {2048, 7168, 8192}) {
    const std::string at = std::to_string(cols) + " columns";
    torch::manual_seed(23);
    const auto on_gpu = torch::TensorOptions().device(kGpu);
    ddp::Float8Linear layer(torch::nn::LinearOptions(cols, 16).bias(false), delayed());
    layer->to(kGpu);
    const auto x = torch::randn({64, cols}, on_gpu.dtype(torch::kBFloat16));
    // A weight at a 4-byte offset (a slice of a flat buffer): the kernel reads an aligned copy.
    const auto weight = (torch::rand({cols + 1}, on_gpu) + 0.5).narrow(0, 1, cols);
    ddp::detail::TensorScaling* scaling = ddp::detail::Float8LinearAccess::fusable_input_scaling(*layer, kGpu);
    ASSERT_NE(scaling, nullptr) << at;
    const auto normed = ddp::float8::rms_norm(x, weight, *layer);
    if (cols == 8192) {
      EXPECT_NE(normed.stride(0), 0) << at << ": too wide for a block's shared memory, the norm returns values";
      EXPECT_TRUE(torch::equal(normed, ddp::rms_norm(x, weight))) << at;
      continue;
    }
    ASSERT_EQ(normed.stride(0), 0) << at << ": the fused path did not run";
    const auto written = scaling->take_offered(normed, "input");
    ASSERT_TRUE(written.has_value()) << at;
    EXPECT_TRUE(
        torch::equal(written->transposed.view(torch::kUInt8), written->data.t().contiguous().view(torch::kUInt8)))
        << at << ": the transpose";
    ddp::Float8Tensor expected;
    expected.data = torch::empty_like(written->data);
    expected.transposed = torch::empty_like(written->transposed);
    expected.amax = torch::zeros({}, on_gpu);
    expected.scale = written->scale.clone();
    ddp::float8::cast_transpose(ddp::rms_norm(x, weight), expected);
    const auto differing = written->data.view(torch::kUInt8).ne(expected.data.view(torch::kUInt8));
    const double share = differing.sum().item<double>() / static_cast<double>(differing.numel());
    std::printf("%s: %.2g of the FP8 bytes differ\n", at.c_str(), share);
    EXPECT_LT(share, 1e-3) << at;
    // One E4M3 step: an eighth of a normal value, 2^-9 among the subnormals.
    const auto got = written->data.to(torch::kFloat), want = expected.data.to(torch::kFloat);
    const auto beyond_a_step = (got - want).abs() - 0.125 * want.abs();
    EXPECT_LE(beyond_a_step.max().item<double>(), 1.0 / 512) << at << ": a value off by more than one E4M3 step";
    EXPECT_NEAR(scaling->pending_amax().item<float>(), expected.amax.item<float>(), 1e-2 * expected.amax.item<float>())
        << at << ": amax";
  }
}

/// float8::add_rms_norm with delta's layer: backward writes delta's gradient
/// as that layer's FP8 output gradient, the values ddp::add_rms_norm's
/// backward writes in bf16 for the layer's own cast. Without a reader the
/// forward is ddp::add_rms_norm's own kernel, so every gradient is equal bit
/// for bit; with one (both sides fused) within the forward norm's rounding.
TEST(Float8AddRmsNormDeltaGradient, IsTheCastTheDeltaLayerWouldMake) {
  struct DeltaCase {
    torch::ScalarType stream_dtype;
    std::int64_t rows;
    bool reader;
  };
  for (const DeltaCase c : {DeltaCase{torch::kFloat, 128, false}, DeltaCase{torch::kBFloat16, 48, false},
                            DeltaCase{torch::kFloat, 48, true}, DeltaCase{torch::kBFloat16, 128, true}}) {
    const std::string what = std::string(c10::toString(c.stream_dtype)) + " stream, " + std::to_string(c.rows) +
                             " rows" + (c.reader ? ", with a reader" : "");
    torch::manual_seed(24);
    const std::int64_t cols = 272, inner = 96;
    const auto on_gpu = torch::TensorOptions().device(kGpu);
    ddp::Float8Linear writers[2] = {ddp::Float8Linear(torch::nn::LinearOptions(inner, cols).bias(false), delayed()),
                                    ddp::Float8Linear(torch::nn::LinearOptions(inner, cols).bias(false), delayed())};
    ddp::Float8Linear readers[2] = {ddp::Float8Linear(torch::nn::LinearOptions(cols, 64).bias(false), delayed()),
                                    ddp::Float8Linear(torch::nn::LinearOptions(cols, 64).bias(false), delayed())};
    for (auto* layer : {writers[0].get(), writers[1].get(), readers[0].get(), readers[1].get()}) layer->to(kGpu);
    {
      torch::NoGradGuard no_grad;
      writers[1]->weight.copy_(writers[0]->weight);
      readers[1]->weight.copy_(readers[0]->weight);
    }
    const auto norm_weight = torch::rand({cols}, on_gpu) + 0.5;
    const ddp::AutocastState autocast{c.stream_dtype == torch::kFloat, torch::kBFloat16};
    for (int step = 0; step < 3; ++step) {
      const std::string at = what + ", step " + std::to_string(step);
      const std::vector<std::int64_t> sizes{2, c.rows / 2, cols};
      const auto x = (torch::randn(sizes, on_gpu) * (step + 1)).to(c.stream_dtype);
      const auto z = torch::randn({2, c.rows / 2, inner}, on_gpu.dtype(torch::kBFloat16));
      const auto grad_output = torch::randn({2, c.rows / 2, c.reader ? 64 : cols}, on_gpu) * 1e-2;
      const auto grad_h = torch::randn(sizes, on_gpu) * 1e-2;
      std::vector<torch::Tensor> leaves[2];
      std::int64_t delta_gradient_stride = -1;
      for (const bool fusing : {false, true}) {
        auto& leaf = leaves[fusing];
        leaf = {x.clone().requires_grad_(), z.clone().requires_grad_(), norm_weight.clone().requires_grad_()};
        torch::Tensor loss;
        {
          const ddp::AutocastStateGuard guard(c10::DeviceType::CUDA, autocast);
          const torch::Tensor delta = writers[fusing](leaf[1]);
          if (fusing) delta.register_hook([&](const torch::Tensor& g) { delta_gradient_stride = g.stride(0); });
          auto [h, normed] = fusing ? ddp::float8::add_rms_norm(leaf[0], delta, writers[1].get(), leaf[2],
                                                                c.reader ? readers[1].get() : nullptr)
                                    : ddp::add_rms_norm(leaf[0], delta, leaf[2]);
          const torch::Tensor out = c.reader ? readers[fusing](normed) : normed;
          loss = (out.to(torch::kFloat) * grad_output).sum() + (h.to(torch::kFloat) * grad_h).sum();
        }
        loss.backward();
      }
      ASSERT_EQ(delta_gradient_stride, 0) << at << ": the fused backward did not run (delta's gradient holds values)";
      const char* names[] = {"x", "the delta layer's input", "the norm weight"};
      for (int i = 0; i < 3; ++i) {
        ASSERT_TRUE(leaves[1][i].grad().defined()) << at << ": gradient of " << names[i];
        if (c.reader) {
          EXPECT_LT(relative_error(leaves[1][i].grad(), leaves[0][i].grad()), 2e-2) << at << ": " << names[i];
        } else {
          EXPECT_TRUE(torch::equal(leaves[1][i].grad(), leaves[0][i].grad())) << at << ": " << names[i];
        }
      }
      if (c.reader) {
        EXPECT_LT(relative_error(writers[1]->weight.grad(), writers[0]->weight.grad()), 2e-2) << at;
      } else {
        EXPECT_TRUE(torch::equal(writers[1]->weight.grad(), writers[0]->weight.grad())) << at << ": layer weight";
        // The amax of the output gradient each layer's history takes.
        EXPECT_TRUE(torch::equal(writers[1]->latest_amaxes()[2], writers[0]->latest_amaxes()[2])) << at << ": amax";
      }
      for (auto* layer : {writers[0].get(), writers[1].get(), readers[0].get(), readers[1].get()}) {
        layer->weight.mutable_grad().reset();
      }
    }
  }
}

/// delta's gradient is a tensor without values, for its layer alone: a delta
/// that is not the layer's output (here its output times 2) gets it through
/// another op, and the layer then refuses what arrives instead of computing
/// from it.
TEST(Float8AddRmsNormDeltaGradient, ADeltaThatIsNotTheLayersOutputIsRefused) {
  const auto on_gpu = torch::TensorOptions().device(kGpu);
  ddp::Float8Linear writer(torch::nn::LinearOptions(32, 64).bias(false), delayed());
  writer->to(kGpu);
  const auto x = torch::randn({16, 64}, on_gpu.dtype(torch::kBFloat16)).requires_grad_();
  const auto z = torch::randn({16, 32}, on_gpu.dtype(torch::kBFloat16)).requires_grad_();
  const auto weight = torch::ones({64}, on_gpu);
  const auto [h, normed] = ddp::float8::add_rms_norm(x, writer(z) * 2, writer.get(), weight, nullptr);
  try {
    (normed.to(torch::kFloat).sum() + h.to(torch::kFloat).sum()).backward();
    FAIL() << "backward ran with delta's gradient in the wrong layer";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("exactly what the fused op returned"), std::string::npos) << e.what();
  }
}

/// A delta layer with a bias adds it after its FP8 matmul: the bias's add
/// would pass the placeholder to the bias gradient too, so its output
/// gradient is not fused, and every gradient is the unfused norm's.
TEST(Float8AddRmsNormDeltaGradient, ALayerWithABiasGetsItsGradientInValues) {
  const auto on_gpu = torch::TensorOptions().device(kGpu);
  torch::manual_seed(25);
  ddp::Float8Linear writers[2] = {ddp::Float8Linear(torch::nn::LinearOptions(32, 64), delayed()),
                                  ddp::Float8Linear(torch::nn::LinearOptions(32, 64), delayed())};
  for (auto& writer : writers) writer->to(kGpu);
  {
    torch::NoGradGuard no_grad;
    writers[1]->weight.copy_(writers[0]->weight);
    writers[1]->bias.copy_(writers[0]->bias);
  }
  const auto x = torch::randn({16, 64}, on_gpu.dtype(torch::kBFloat16));
  const auto z = torch::randn({16, 32}, on_gpu.dtype(torch::kBFloat16));
  const auto weight = torch::rand({64}, on_gpu) + 0.5;
  std::int64_t delta_gradient_stride = 0;
  for (const bool fusing : {false, true}) {
    const torch::Tensor delta = writers[fusing](z.clone().requires_grad_());
    if (fusing) delta.register_hook([&](const torch::Tensor& g) { delta_gradient_stride = g.stride(0); });
    const auto [h, normed] = fusing ? ddp::float8::add_rms_norm(x, delta, writers[1].get(), weight, nullptr)
                                    : ddp::add_rms_norm(x, delta, weight);
    (normed.to(torch::kFloat).square().sum() + h.to(torch::kFloat).sum()).backward();
  }
  EXPECT_NE(delta_gradient_stride, 0) << "delta's gradient must hold values";
  EXPECT_TRUE(torch::equal(writers[1]->bias.grad(), writers[0]->bias.grad())) << "bias gradient";
  EXPECT_TRUE(torch::equal(writers[1]->weight.grad(), writers[0]->weight.grad())) << "weight gradient";
}

}  // namespace
