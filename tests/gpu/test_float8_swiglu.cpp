// SwiGLU written straight into FP8 (float8/swiglu.cu) and the public
// operation over it, ddp::float8::swiglu_linear.

#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "float8/kernels.h"
#include "support/relative_error.h"

namespace {

using ddp::testing::relative_error;

const torch::Device kGpu(torch::kCUDA, 0);

/// A cast with a given scale, as TensorScaling::destination makes it.
ddp::Float8Tensor destination(int64_t rows, int64_t cols, torch::ScalarType float8, float scale) {
  const auto options = torch::TensorOptions().device(kGpu);
  ddp::Float8Tensor d;
  d.data = torch::empty({rows, cols}, options.dtype(float8));
  d.transposed = torch::empty({cols, rows}, options.dtype(float8));
  d.amax = torch::zeros({}, options);
  d.scale = torch::full({}, scale, options);
  return d;
}

/// What the fused kernel wrote against the plain cast of the fp32 result
/// computed by ATen: the kernel rounds once where the unfused path rounds to
/// bf16 first, and its fp32 arithmetic may contract a multiply and an add
/// that ATen rounds apart, so a value near an FP8 rounding boundary may land
/// one step away. Everything else is equal: the transpose is the data's, the
/// amax the reference's within fp32 rounding, and the decoded values within
/// one FP8 step of the reference.
void expect_cast_of(const ddp::Float8Tensor& fused, const torch::Tensor& values32, const std::string& what) {
  ddp::Float8Tensor reference =
      destination(values32.size(0), values32.size(1), fused.data.scalar_type(), fused.scale.item<float>());
  ddp::float8::cast_transpose(values32, reference);
  EXPECT_TRUE(torch::equal(fused.transposed.view(torch::kByte), fused.data.t().contiguous().view(torch::kByte)))
      << what << ": the transpose is not the data's";
  const double different =
      fused.data.view(torch::kByte).ne(reference.data.view(torch::kByte)).to(torch::kDouble).mean().item<double>();
  EXPECT_LT(different, 1e-3) << what << ": FP8 bytes that differ from the cast of the fp32 result";
  EXPECT_NEAR(fused.amax.item<float>(), reference.amax.item<float>(), 1e-6 * reference.amax.item<float>()) << what;
  EXPECT_EQ(fused.inverse_scale.item<float>(), reference.inverse_scale.item<float>()) << what;
  // One step of a 3-bit (e4m3) or 2-bit (e5m2) mantissa, relative, or the
  // smallest subnormal step near zero.
  const bool e4m3 = fused.data.scalar_type() == torch::kFloat8_e4m3fn;
  const double step = e4m3 ? 0.125 : 0.25;
  const double smallest = (e4m3 ? std::ldexp(1.0, -9) : std::ldexp(1.0, -16)) * fused.inverse_scale.item<float>();
  const auto decoded = fused.data.to(torch::kDouble) * fused.inverse_scale.item<float>();
  const auto expected = reference.data.to(torch::kDouble) * reference.inverse_scale.item<float>();
  const auto allowed = expected.abs() * step + smallest;
  EXPECT_TRUE((decoded - expected).abs().le(allowed).all().item<bool>()) << what << ": a value off by more than a step";
}

TEST(Float8Swiglu, KernelsWriteTheCastOfTheFp32Swiglu) {
  const std::pair<int64_t, int64_t> shapes[] = {{256, 704}, {48, 80}, {37, 29}};
  for (const auto& [rows, cols] : shapes) {
    const std::string at = std::to_string(rows) + " x " + std::to_string(cols);
    torch::manual_seed(13);
    const auto options = torch::TensorOptions().device(kGpu);
    const auto gate = (3 * torch::randn({rows, cols}, options)).to(torch::kBFloat16);
    const auto up = torch::randn({rows, cols}, options).to(torch::kBFloat16);
    const auto grad_y = (1e-3 * torch::randn({rows, cols}, options)).to(torch::kBFloat16);
    const auto g = gate.to(torch::kFloat), u = up.to(torch::kFloat), dy = grad_y.to(torch::kFloat);
    const auto sigmoid = torch::sigmoid(g);

    auto y = destination(rows, cols, torch::kFloat8_e4m3fn, 37.5f);
    ddp::detail::swiglu_to_float8(gate, up, y);
    expect_cast_of(y, g * sigmoid * u, at + " forward");

    auto grad_gate = destination(rows, cols, torch::kFloat8_e5m2, 3.0e5f);
    auto grad_up = destination(rows, cols, torch::kFloat8_e5m2, 1.5e5f);
    ddp::detail::swiglu_gradients_to_float8(grad_y, gate, up, grad_gate, grad_up);
    const auto grad_gate32 = dy * u * sigmoid * (1 + g * (1 - sigmoid)), grad_up32 = dy * g * sigmoid;
    expect_cast_of(grad_gate, grad_gate32, at + " gradient of gate");
    expect_cast_of(grad_up, grad_up32, at + " gradient of up");

    // gate and up as the halves of one projection's output, and their
    // gradients as the halves of one cast (one scale and amax): row strides
    // of 2 cols (odd cols take the kernel's unvectorized path).
    const auto gate_up = torch::cat({gate, up}, 1);
    auto y_of_halves = destination(rows, cols, torch::kFloat8_e4m3fn, 37.5f);
    ddp::detail::swiglu_to_float8(gate_up.narrow(1, 0, cols), gate_up.narrow(1, cols, cols), y_of_halves);
    expect_cast_of(y_of_halves, g * sigmoid * u, at + " forward of halves");
    auto grad_both = destination(rows, 2 * cols, torch::kFloat8_e5m2, 3.0e5f);
    ddp::Float8Tensor halves[2];
    for (const int half : {0, 1}) {
      halves[half] = grad_both;
      halves[half].data = grad_both.data.narrow(1, half * cols, cols);
      halves[half].transposed = grad_both.transposed.narrow(0, half * cols, cols);
    }
    ddp::detail::swiglu_gradients_to_float8(grad_y, gate_up.narrow(1, 0, cols), gate_up.narrow(1, cols, cols),
                                            halves[0], halves[1]);
    grad_both.inverse_scale = halves[0].inverse_scale;
    expect_cast_of(grad_both, torch::cat({grad_gate32, grad_up32}, 1), at + " gradients as halves of one cast");
  }
}

ddp::Float8Linear delayed_layer(int64_t in, int64_t out) {
  ddp::Float8Linear layer(torch::nn::LinearOptions(in, out).bias(false),
                          ddp::Float8Options().scaling(ddp::Float8Scaling::kDelayed).amax_history_len(8));
  layer->to(kGpu);
  return layer;
}

/// Three steps of a feed-forward with FP8 delayed scaling, computed two ways
/// from the same weights (`pairs`: each layer twice; the second copy takes
/// the first's weight): forward(input, 0) with the layers casting an ATen
/// SwiGLU themselves, forward(input, 1) through swiglu_linear (FP8 written by
/// SwiGLU, forward and backward), each returning {the output of the layer
/// before SwiGLU, the feed-forward's output}. The two differ only where
/// rounding to bf16 first moves a value across an FP8 rounding boundary. The
/// gradient reaching that first layer on the fused side is the placeholder,
/// so backward really was fused.
void expect_fused_feed_forward_matches(
    std::vector<std::array<ddp::Float8Linear, 2>> pairs,
    const std::function<std::pair<torch::Tensor, torch::Tensor>(const torch::Tensor& input, int fused)>& forward) {
  {
    torch::NoGradGuard no_grad;
    for (auto& pair : pairs) pair[1]->weight.copy_(pair[0]->weight);
  }
  const auto bf16 = torch::TensorOptions().device(kGpu).dtype(torch::kBFloat16);
  for (int step = 0; step < 3; ++step) {
    const std::string at = "step " + std::to_string(step);
    const auto x = torch::randn({4, 64, 256}, bf16);
    const auto grad_output = 1e-2 * torch::randn({4, 64, 256}, bf16);
    torch::Tensor outputs[2], grads[2];
    int64_t first_grad_stride[2] = {-1, -1};
    for (const int fused : {0, 1}) {
      const auto input = x.clone().requires_grad_();
      const auto [first, output] = forward(input, fused);
      first.register_hook([&, fused](const torch::Tensor& grad) { first_grad_stride[fused] = grad.stride(0); });
      outputs[fused] = output;
      outputs[fused].backward(grad_output);
      grads[fused] = input.grad();
    }
    EXPECT_EQ(first_grad_stride[1], 0) << at << ": the layer before SwiGLU got a placeholder gradient";
    EXPECT_GT(first_grad_stride[0], 0) << at;
    const double output_error = relative_error(outputs[1], outputs[0]);
    const double grad_error = relative_error(grads[1], grads[0]);
    std::printf("swiglu_linear fp8 %s: output relative error %.3g, input gradient %.3g\n", at.c_str(), output_error,
                grad_error);
    EXPECT_LT(output_error, 5e-2) << at;
    EXPECT_LT(grad_error, 5e-2) << at;
    for (auto& pair : pairs) {
      EXPECT_LT(relative_error(pair[1]->weight.grad(), pair[0]->weight.grad()), 5e-2) << at;
      pair[0]->zero_grad();
      pair[1]->zero_grad();
    }
  }
}

TEST(Float8Swiglu, SwigluLinearMatchesTheLayersOwnCasts) {
  torch::manual_seed(14);
  std::array<ddp::Float8Linear, 2> w1 = {delayed_layer(256, 704), delayed_layer(256, 704)};
  std::array<ddp::Float8Linear, 2> w3 = {delayed_layer(256, 704), delayed_layer(256, 704)};
  std::array<ddp::Float8Linear, 2> w2 = {delayed_layer(704, 256), delayed_layer(704, 256)};
  expect_fused_feed_forward_matches({w1, w2, w3}, [&](const torch::Tensor& input, int fused) {
    const auto gate = w1[fused](input);
    const auto up = w3[fused](input);
    return std::pair{
        gate, fused ? ddp::float8::swiglu_linear(gate, up, *w2[1], *w1[1], *w3[1]) : w2[0](torch::silu(gate) * up)};
  });
}

/// The same with gate and up from one layer (w13), which takes one cast of
/// its whole output gradient.
TEST(Float8Swiglu, SwigluLinearOfOneGateUpLayerMatchesTheLayersOwnCasts) {
  torch::manual_seed(16);
  std::array<ddp::Float8Linear, 2> w13 = {delayed_layer(256, 2 * 704), delayed_layer(256, 2 * 704)};
  std::array<ddp::Float8Linear, 2> w2 = {delayed_layer(704, 256), delayed_layer(704, 256)};
  expect_fused_feed_forward_matches({w13, w2}, [&](const torch::Tensor& input, int fused) {
    const auto gate_up = w13[fused](input);
    return std::pair{gate_up, fused ? ddp::float8::swiglu_linear(gate_up, *w2[1], *w13[1])
                                    : w2[0](torch::silu(gate_up.narrow(-1, 0, 704)) * gate_up.narrow(-1, 704, 704))};
  });
}

/// Where the layers cannot take fused casts (FP8 off, or current scaling),
/// swiglu_linear is down(swiglu(gate, up)) with the caller's SwiGLU, exactly.
TEST(Float8Swiglu, SwigluLinearFallsBackToTheGivenSwiglu) {
  torch::manual_seed(15);
  const auto bf16 = torch::TensorOptions().device(kGpu).dtype(torch::kBFloat16);
  for (const bool float8 : {false, true}) {
    ddp::Float8Linear w1(torch::nn::LinearOptions(64, 96).bias(false), ddp::Float8Options().enabled(float8));
    ddp::Float8Linear w3(torch::nn::LinearOptions(64, 96).bias(false), ddp::Float8Options().enabled(float8));
    ddp::Float8Linear w2(torch::nn::LinearOptions(96, 64).bias(false), ddp::Float8Options().enabled(float8));
    for (auto* layer : {&w1, &w2, &w3}) (*layer)->to(kGpu, torch::kBFloat16);
    const auto x = torch::randn({32, 64}, bf16);
    const auto gate = w1(x), up = w3(x);
    int calls = 0;
    const auto product = [&](const torch::Tensor& g, const torch::Tensor& u) {
      ++calls;
      return g * u;
    };
    const auto output = ddp::float8::swiglu_linear(gate, up, *w2, *w1, *w3, product);
    EXPECT_EQ(calls, 1) << (float8 ? "current scaling" : "FP8 off");
    EXPECT_TRUE(torch::equal(output, w2(gate * up))) << (float8 ? "current scaling" : "FP8 off");
    const auto gate_up = torch::cat({gate, up}, -1);
    const auto halves_product = [&](const torch::Tensor& both) {
      ++calls;
      return both.narrow(-1, 0, 96) * both.narrow(-1, 96, 96);
    };
    const auto output_of_halves = ddp::float8::swiglu_linear(gate_up, *w2, *w1, halves_product);
    EXPECT_EQ(calls, 2) << (float8 ? "current scaling, halves" : "FP8 off, halves");
    EXPECT_TRUE(torch::equal(output_of_halves, w2(gate * up)))
        << (float8 ? "current scaling, halves" : "FP8 off, halves");
  }
}

}  // namespace
