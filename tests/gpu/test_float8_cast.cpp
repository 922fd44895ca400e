// The fused FP8 cast and delayed-scaling kernels against ATen's unfused
// expressions, bit for bit, and Float8Linear's use of them: the transposes
// and amaxes it asks for.

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "float8/kernels.h"
#include "float8/scaling.h"

namespace {

const torch::Device kGpu(torch::kCUDA, 0);

struct Format {
  torch::ScalarType dtype;
  float largest;
  const char* name;
};
const Format kFormats[] = {{torch::kFloat8_e4m3fn, 448.0f, "e4m3fn"}, {torch::kFloat8_e5m2, 57344.0f, "e5m2"}};
const torch::ScalarType kInputDtypes[] = {torch::kBFloat16, torch::kHalf, torch::kFloat};

/// Values across both formats' ranges: normal ones, some past the largest
/// finite value once scaled (up to ~2.5e5, within fp16), some in the FP8
/// subnormal range, and exact zeros of both signs.
torch::Tensor make_input(int64_t rows, int64_t cols, torch::ScalarType dtype) {
  auto x = torch::randn({rows, cols}, torch::TensorOptions().device(kGpu)) * 8;
  auto flat = x.view(-1);
  flat.slice(0, 0, c10::nullopt, 7).mul_(1000);
  flat.slice(0, 3, c10::nullopt, 11).mul_(1e-3);
  flat.slice(0, 5, c10::nullopt, 13).zero_();
  flat.slice(0, 6, c10::nullopt, 17).fill_(-0.0);
  return x.to(dtype);
}

/// Both as bytes: equal, or the number of differing bytes and the first.
void expect_same_bytes(const torch::Tensor& actual, const torch::Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  // Flat first: a 0-dim tensor cannot be viewed as bytes of another size.
  const auto a = actual.contiguous().view(-1).view(torch::kByte).cpu();
  const auto e = expected.contiguous().view(-1).view(torch::kByte).cpu();
  const auto differ = a.ne(e).nonzero();
  if (differ.numel() == 0) return;
  const int64_t first = differ[0].item<int64_t>();
  ADD_FAILURE() << what << ": " << differ.size(0) << " of " << a.numel() << " bytes differ; the first, at flat index "
                << first << ", is 0x" << std::hex << a[first].item<int>() << " instead of 0x" << e[first].item<int>();
}

/// A cast with `scale`, its outputs filled with NaN bytes: anything the
/// kernel fails to write stays NaN, which the reference (finite inputs)
/// never holds.
ddp::Float8Tensor make_outputs(int64_t rows, int64_t cols, torch::ScalarType float8_dtype, const torch::Tensor& scale) {
  const auto options = torch::TensorOptions().device(kGpu).dtype(float8_dtype);
  ddp::Float8Tensor outputs;
  outputs.scale = scale;
  outputs.data = torch::empty({rows, cols}, options);
  outputs.transposed = torch::empty({cols, rows}, options);
  outputs.data.view(torch::kByte).fill_(0x7F);
  outputs.transposed.view(torch::kByte).fill_(0x7F);
  outputs.amax = torch::zeros({}, torch::TensorOptions().device(kGpu));
  outputs.inverse_scale = torch::full({}, std::numeric_limits<float>::quiet_NaN(), torch::TensorOptions().device(kGpu));
  return outputs;
}

TEST(Float8Cast, MatchesTheUnfusedCastBitForBit) {
  torch::manual_seed(0);
  // Whole 64 x 64 tiles and partial ones; rows or columns not multiples of
  // 4 or 8 take the kernel's unvectorised paths.
  const std::pair<int64_t, int64_t> shapes[] = {{48, 80}, {1000, 16}, {16, 4104}, {128, 192}, {37, 29}, {1, 3}};
  // A power of two only moves the exponent, so rounding ties survive; 3.7 does not.
  for (const float scale_value : {1.0f, 3.7f}) {
    const auto scale = torch::full({}, scale_value, torch::TensorOptions().device(kGpu));
    for (const auto& [rows, cols] : shapes) {
      for (const auto input_dtype : kInputDtypes) {
        const auto x = make_input(rows, cols, input_dtype);
        for (const auto& format : kFormats) {
          const std::string what = std::string(format.name) + " from " + c10::toString(input_dtype) + ", " +
                                   std::to_string(rows) + "x" + std::to_string(cols) + ", scale " +
                                   std::to_string(scale_value);
          const auto reference = (x.to(torch::kFloat) * scale).clamp(-format.largest, format.largest).to(format.dtype);
          auto outputs = make_outputs(rows, cols, format.dtype, scale);
          ddp::float8::cast_transpose(x, outputs);
          expect_same_bytes(outputs.data, reference, what + ", data");
          expect_same_bytes(outputs.transposed, reference.t().contiguous(), what + ", transposed");
          EXPECT_EQ(outputs.amax.item<float>(), x.abs().max().item<float>()) << what << ", amax";
          expect_same_bytes(outputs.inverse_scale, scale.reciprocal(), what + ", inverse scale");
        }
      }
    }
  }
}

TEST(Float8Cast, SaturatesAtLargestAndKeepsNaN) {
  for (const auto input_dtype : kInputDtypes) {
    for (const auto& format : kFormats) {
      const std::string what = std::string(format.name) + " from " + c10::toString(input_dtype);
      auto x = torch::zeros({16, 32}, torch::TensorOptions().device(kGpu).dtype(input_dtype));
      x[0][0] = 3e4;  // past both formats' range once scaled by 4
      x[1][0] = -3e4;
      x[2][0] = std::numeric_limits<float>::infinity();
      x[3][0] = std::numeric_limits<float>::quiet_NaN();
      x[4][0] = 1;
      x[5][0] = -std::numeric_limits<float>::infinity();
      const auto scale = torch::full({}, 4.0f, torch::TensorOptions().device(kGpu));
      const float largest = format.largest;
      auto outputs = make_outputs(16, 32, format.dtype, scale);
      ddp::float8::cast_transpose(x, outputs);
      const auto data = outputs.data.to(torch::kFloat).cpu();
      EXPECT_EQ(data[0][0].item<float>(), largest) << what;
      EXPECT_EQ(data[1][0].item<float>(), -largest) << what;
      EXPECT_EQ(data[2][0].item<float>(), largest) << what;
      EXPECT_TRUE(std::isnan(data[3][0].item<float>())) << what;
      EXPECT_EQ(data[4][0].item<float>(), 4.0f) << what;
      EXPECT_EQ(data[5][0].item<float>(), -largest) << what;
      EXPECT_TRUE(std::isnan(outputs.transposed.to(torch::kFloat)[0][3].item<float>())) << what;
      EXPECT_TRUE(std::isnan(outputs.amax.item<float>())) << what << ": the amax of a tensor with a NaN is NaN";
    }
  }
}

TEST(Float8Cast, WritesOnlyWhatIsAskedFor) {
  const auto x = make_input(64, 64, torch::kBFloat16);
  const auto scale = torch::ones({}, torch::TensorOptions().device(kGpu));
  ddp::Float8Tensor outputs;
  outputs.data = torch::empty({64, 64}, torch::TensorOptions().device(kGpu).dtype(torch::kFloat8_e4m3fn));
  outputs.scale = scale;
  ddp::float8::cast_transpose(x, outputs);
  expect_same_bytes(outputs.data, (x.to(torch::kFloat) * scale).clamp(-448, 448).to(torch::kFloat8_e4m3fn), "data");
  EXPECT_FALSE(outputs.transposed.defined());
  EXPECT_FALSE(outputs.amax.defined());
  // What at::_scaled_mm needs is always written.
  expect_same_bytes(outputs.inverse_scale, scale.reciprocal(), "inverse scale");

  // Only the transpose (an output gradient when no input gradient is needed).
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{64, 64}, {37, 29}}) {
    const auto y = make_input(rows, cols, torch::kBFloat16);
    ddp::Float8Tensor transposed_only;
    transposed_only.transposed = torch::empty({cols, rows}, torch::TensorOptions().device(kGpu).dtype(torch::kFloat8_e5m2));
    transposed_only.scale = scale;
    ddp::float8::cast_transpose(y, transposed_only);
    expect_same_bytes(transposed_only.transposed,
                      (y.to(torch::kFloat) * scale).clamp(-57344, 57344).to(torch::kFloat8_e5m2).t().contiguous(),
                      "transposed only, " + std::to_string(rows) + "x" + std::to_string(cols));
  }
}

/// Inputs and data may be column ranges of wider matrices (rows contiguous,
/// a row stride past the width): a stride that breaks the vector width (68
/// bf16) and one that keeps it (72, from a 16-byte-aligned column), into
/// data that is itself a column range; the bytes around the range stay as
/// they were. A transposed input (columns not contiguous) is refused.
TEST(Float8Cast, ColumnRangesOfWiderMatrices) {
  torch::manual_seed(2);
  const auto scale = torch::full({}, 3.7f, torch::TensorOptions().device(kGpu));
  const auto fp8 = torch::TensorOptions().device(kGpu).dtype(torch::kFloat8_e4m3fn);
  for (const auto& [width, begin] : {std::pair<int64_t, int64_t>{68, 0}, {72, 8}}) {
    const std::string what =
        "columns " + std::to_string(begin) + ".." + std::to_string(begin + 64) + " of " + std::to_string(width);
    const auto wide = make_input(40, width, torch::kBFloat16);
    const auto x = wide.slice(1, begin, begin + 64);
    auto outputs = make_outputs(40, 64, torch::kFloat8_e4m3fn, scale);
    const auto wide_data = torch::empty({40, 96}, fp8);
    wide_data.view(torch::kByte).fill_(0x7F);
    outputs.data = wide_data.slice(1, 16, 80);
    ddp::float8::cast_transpose(x, outputs);
    const auto reference = (x.to(torch::kFloat) * scale).clamp(-448, 448).to(torch::kFloat8_e4m3fn);
    expect_same_bytes(outputs.data, reference, what + ", data");
    expect_same_bytes(outputs.transposed, reference.t().contiguous(), what + ", transposed");
    for (const auto& [begin_byte, end_byte] : {std::pair<int64_t, int64_t>{0, 16}, {80, 96}}) {
      EXPECT_TRUE(wide_data.slice(1, begin_byte, end_byte).view(torch::kByte).eq(0x7F).all().item<bool>())
          << what << ": bytes " << begin_byte << ".." << end_byte << " of each row were written";
    }
    EXPECT_EQ(outputs.amax.item<float>(), x.abs().max().item<float>()) << what << ", amax";
    expect_same_bytes(outputs.inverse_scale, scale.reciprocal(), what + ", inverse scale");
  }
  const auto square = make_input(64, 64, torch::kBFloat16);
  auto outputs = make_outputs(64, 64, torch::kFloat8_e4m3fn, scale);
  try {
    ddp::float8::cast_transpose(square.t(), outputs);
    ADD_FAILURE() << "a transposed input was accepted";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("with contiguous rows"), std::string::npos) << error.what();
  }
}

/// The amax accumulates: one output taken over two casts is the amax of both.
TEST(Float8Cast, AmaxAccumulatesAcrossCasts) {
  const auto scale = torch::ones({}, torch::TensorOptions().device(kGpu));
  const auto small = torch::full({32, 32}, 2.0f, torch::TensorOptions().device(kGpu).dtype(torch::kBFloat16));
  const auto large = torch::full({32, 32}, -5.0f, torch::TensorOptions().device(kGpu).dtype(torch::kBFloat16));
  auto outputs = make_outputs(32, 32, torch::kFloat8_e4m3fn, scale);
  ddp::float8::cast_transpose(large, outputs);
  ddp::float8::cast_transpose(small, outputs);
  EXPECT_EQ(outputs.amax.item<float>(), 5.0f);
}

/// Current scaling (a cast given the amax and no scale): the kernel forms
/// largest / amax, writes it and its inverse as ATen's ops form them, bit for
/// bit, an all-zero tensor's amax being raised to the minimum instead of
/// giving an infinite scale; the amax it was given stays as it was.
TEST(Float8Cast, ScaleFromAmaxMatchesTheUnfusedArithmetic) {
  torch::manual_seed(1);
  for (const auto& format : kFormats) {
    for (const bool zero : {false, true}) {
      const std::string what = std::string(format.name) + (zero ? ", all-zero input" : "");
      const auto x = zero ? torch::zeros({96, 160}, torch::TensorOptions().device(kGpu).dtype(torch::kBFloat16))
                          : make_input(96, 160, torch::kBFloat16);
      const auto amax = x.abs().max().to(torch::kFloat);
      const auto scale = format.largest / amax.clamp_min(ddp::detail::kFloat8MinAmax);
      auto outputs = make_outputs(96, 160, format.dtype, torch::Tensor());
      outputs.amax = amax.clone();
      ddp::float8::cast_transpose(x, outputs);
      expect_same_bytes(outputs.data, (x.to(torch::kFloat) * scale).clamp(-format.largest, format.largest).to(format.dtype),
                        what + ", data");
      expect_same_bytes(outputs.scale, scale, what + ", scale");
      expect_same_bytes(outputs.inverse_scale, scale.reciprocal(), what + ", inverse scale");
      expect_same_bytes(outputs.amax, amax, what + ", amax left as given");
    }
  }
}

/// The recipes the delayed-scaling tests run: histories longer than the
/// update kernel's block, both amax rules, a margin.
const ddp::Float8Options kDelayedRecipes[] = {
    ddp::Float8Options().scaling(ddp::Float8Scaling::kDelayed).amax_history_len(16),
    ddp::Float8Options().scaling(ddp::Float8Scaling::kDelayed).amax_history_len(600).margin(2),
    ddp::Float8Options()
        .scaling(ddp::Float8Scaling::kDelayed)
        .amax_history_len(600)
        .amax_compute(ddp::AmaxCompute::kMostRecent),
    ddp::Float8Options().scaling(ddp::Float8Scaling::kDelayed).amax_history_len(1),
};

std::string describe(const ddp::Float8Options& recipe, const Format& format) {
  return std::string(format.name) + ", history " + std::to_string(recipe.amax_history_len()) +
         (recipe.amax_compute() == ddp::AmaxCompute::kMax ? " max" : " most recent") + ", margin " +
         std::to_string(recipe.margin());
}

/// Transformer Engine's DelayedScaling in ATen ops: newest amax first, the
/// scale from the history's max (or newest), unchanged while that amax is
/// not finite and positive.
struct ReferenceHistory {
  ReferenceHistory(const ddp::Float8Options& recipe, const Format& format, const torch::Device& device)
      : recipe(recipe),
        target(format.largest / std::ldexp(1.0, recipe.margin())),
        history(torch::zeros({recipe.amax_history_len()}, torch::TensorOptions().device(device))),
        scale(torch::ones({}, torch::TensorOptions().device(device))) {}

  void enter(const torch::Tensor& amax) {
    history = torch::cat({amax.to(torch::kFloat).reshape({1}), history.narrow(0, 0, history.size(0) - 1)});
    refresh();
  }
  void refresh() {
    const auto amax = recipe.amax_compute() == ddp::AmaxCompute::kMax ? history.max() : history[0];
    scale = torch::where(amax.isfinite() & (amax > 0), target / amax.clamp_min(ddp::detail::kFloat8MinAmax), scale);
  }

  ddp::Float8Options recipe;
  double target;
  torch::Tensor history;
  torch::Tensor scale;
};

/// Delayed scaling's fused bookkeeping (the cast kernel's amax, committed by
/// update_amax_histories) against the same bookkeeping in ATen ops: the same
/// FP8 bytes and inverse scales for every cast, and the same amax histories
/// and scales. A cast's amax waits until the next cast commits it (even
/// casts) or it is committed explicitly (odd casts). An all-zero tensor and
/// an overflow must keep the scale.
TEST(Float8Cast, DelayedScalingBookkeepingMatchesAtenOps) {
  torch::manual_seed(2);
  for (const auto& recipe : kDelayedRecipes) {
    for (const auto& format : kFormats) {
      const std::string what = describe(recipe, format);
      ReferenceHistory reference(recipe, format, kGpu);
      ddp::detail::TensorScaling scaling(recipe, format.dtype, kGpu);
      for (int step = 0; step < 40; ++step) {
        const std::string at_step = what + ", cast " + std::to_string(step);
        // Amaxes that rise and fall over the steps, one all-zero tensor and
        // one overflow (an infinite amax), both of which must keep the scale.
        auto x = make_input(64, 96, torch::kBFloat16) * (1 + step % 7) / (1 + step % 5);
        if (step == 11) x.zero_();
        if (step == 23) x[5][7] = std::numeric_limits<float>::infinity();
        const auto expected =
            (x.to(torch::kFloat) * reference.scale).clamp(-format.largest, format.largest).to(format.dtype);

        const auto actual = scaling.cast(x, /*with_transposed=*/true);
        expect_same_bytes(actual.data, expected, at_step + ", data");
        expect_same_bytes(actual.transposed, expected.t().contiguous(), at_step + ", transposed");
        expect_same_bytes(actual.inverse_scale, reference.scale.reciprocal(), at_step + ", inverse scale");
        // Every earlier amax is in the history; this cast's waits.
        expect_same_bytes(scaling.amax_history(), reference.history, at_step + ", amax history");
        expect_same_bytes(scaling.scale(), reference.scale, at_step + ", scale");
        expect_same_bytes(scaling.pending_amax(), x.abs().max().to(torch::kFloat), at_step + ", pending amax");
        EXPECT_TRUE(scaling.amax_pending()) << at_step;
        reference.enter(x.abs().max());
        if (step % 2 == 1) {
          scaling.commit_pending_amax();
          expect_same_bytes(scaling.amax_history(), reference.history, at_step + ", history after the commit");
          expect_same_bytes(scaling.scale(), reference.scale, at_step + ", scale after the commit");
          expect_same_bytes(scaling.pending_amax(), torch::zeros({}, torch::TensorOptions().device(kGpu)),
                            at_step + ", pending amax after the commit");
          EXPECT_FALSE(scaling.amax_pending()) << at_step;
        }
        if (::testing::Test::HasFailure()) return;
      }
      // After a reduction across ranks the scale is recomputed from the history alone.
      scaling.commit_pending_amax();
      scaling.amax_history().mul_(3);
      reference.history.mul_(3);
      reference.refresh();
      scaling.refresh_scale();
      expect_same_bytes(scaling.scale(), reference.scale, what + ", scale refreshed from the history");
      expect_same_bytes(scaling.amax_history(), reference.history, what + ", history left alone by the refresh");
    }
  }
}

/// A model's commits in a few launches (more histories than one launch
/// takes, of every recipe and format) give what one commit per cast gives;
/// and with amaxes given (reduced across ranks), those enter every history,
/// pending or not, as ATen's ops on the CPU enter them.
TEST(Float8Cast, BatchedCommitsMatchOneByOneAndTheAtenOps) {
  torch::manual_seed(3);
  std::vector<ddp::detail::TensorScaling> one_by_one, batched, entered_gpu, entered_cpu;
  std::vector<std::string> names;
  for (int copy = 0; copy < 20; ++copy) {
    for (const auto& recipe : kDelayedRecipes) {
      for (const auto& format : kFormats) {
        for (auto* scalings : {&one_by_one, &batched, &entered_gpu}) scalings->emplace_back(recipe, format.dtype, kGpu);
        entered_cpu.emplace_back(recipe, format.dtype, torch::kCPU);
        names.push_back(describe(recipe, format) + ", copy " + std::to_string(copy));
      }
    }
  }
  const auto pointers = [](std::vector<ddp::detail::TensorScaling>& scalings) {
    std::vector<ddp::detail::TensorScaling*> result;
    for (auto& scaling : scalings) result.push_back(&scaling);
    return result;
  };
  const std::size_t count = names.size();
  ASSERT_GT(count, 64u) << "more histories than one launch of the kernel takes";
  // Two blocks of one launch must never update one history.
  EXPECT_THROW(ddp::detail::TensorScaling::commit_pending_amaxes({&batched[0], &batched[0]}), c10::Error);
  for (int step = 0; step < 5; ++step) {
    for (std::size_t i = 0; i < count; ++i) {
      // One in three casts nothing in this step: no pending amax.
      if ((i + step) % 3 == 0) continue;
      const auto x = make_input(32, 64, torch::kBFloat16) * (1 + (i + step) % 5);
      for (auto* scalings : {&one_by_one, &batched, &entered_gpu}) (*scalings)[i].cast(x);
      entered_cpu[i].cast(x.cpu());
    }
    for (auto& scaling : one_by_one) scaling.commit_pending_amax();
    ddp::detail::TensorScaling::commit_pending_amaxes(pointers(batched));
    // Stand-ins for the reduced amaxes: twice each pending one, so that
    // they differ from what the casts took.
    std::vector<torch::Tensor> pending;
    for (auto& scaling : entered_gpu) pending.push_back(scaling.pending_amax() * 2);
    const auto amaxes = torch::stack(pending);
    ddp::detail::TensorScaling::commit_pending_amaxes(pointers(entered_gpu), amaxes);
    ddp::detail::TensorScaling::commit_pending_amaxes(pointers(entered_cpu), amaxes.cpu());
    for (std::size_t i = 0; i < count; ++i) {
      const std::string what = names[i] + ", step " + std::to_string(step);
      expect_same_bytes(batched[i].amax_history(), one_by_one[i].amax_history(), what + ", history");
      expect_same_bytes(batched[i].scale(), one_by_one[i].scale(), what + ", scale");
      expect_same_bytes(batched[i].pending_amax(), one_by_one[i].pending_amax(), what + ", pending amax");
      expect_same_bytes(entered_gpu[i].amax_history(), entered_cpu[i].amax_history(), what + ", entered history");
      expect_same_bytes(entered_gpu[i].scale(), entered_cpu[i].scale(), what + ", entered scale");
      expect_same_bytes(entered_gpu[i].amax_history()[0], amaxes[i], what + ", the entered amax is the newest");
      EXPECT_FALSE(batched[i].amax_pending() || entered_gpu[i].amax_pending()) << what;
      if (::testing::Test::HasFailure()) return;
    }
  }
}

/// Forward without grad mode, or with an input that needs no gradient,
/// skips the transposed copies backward would read: the results must not
/// change.
TEST(Float8Linear, SkippedTransposesChangeNoResult) {
  torch::manual_seed(4);
  ddp::Float8Linear layer(torch::nn::LinearOptions(256, 512), ddp::Float8Options());
  layer->to(kGpu);
  const auto input = torch::randn({64, 256}, torch::TensorOptions().device(kGpu).dtype(torch::kBFloat16));
  const auto grad_output = torch::randn({64, 512}, torch::TensorOptions().device(kGpu).dtype(torch::kBFloat16));

  const auto tracked = input.clone().requires_grad_();
  const auto output = layer(tracked);
  output.backward(grad_output);
  const auto grad_weight = layer->weight.grad().clone();
  ASSERT_TRUE(tracked.grad().defined());

  {
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(torch::equal(layer(input), output.detach())) << "forward under no_grad";
  }
  layer->zero_grad();
  const auto untracked_output = layer(input);
  EXPECT_TRUE(torch::equal(untracked_output.detach(), output.detach())) << "forward of an input without grad";
  untracked_output.backward(grad_output);
  EXPECT_TRUE(torch::equal(layer->weight.grad(), grad_weight)) << "weight gradient of an input without grad";
}

/// A batch without rows (the last, short shard of a dataset) gives an empty
/// bf16 output and zero gradients under both recipes, and leaves the FP8
/// state as it was.
TEST(Float8Linear, EmptyBatchGivesAnEmptyOutputAndZeroGradients) {
  for (const auto scaling : {ddp::Float8Scaling::kCurrent, ddp::Float8Scaling::kDelayed}) {
    const std::string what = scaling == ddp::Float8Scaling::kCurrent ? "current scaling" : "delayed scaling";
    ddp::Float8Linear layer(torch::nn::LinearOptions(256, 512), ddp::Float8Options().scaling(scaling));
    layer->to(kGpu);
    const auto input =
        torch::empty({0, 256}, torch::TensorOptions().device(kGpu).dtype(torch::kBFloat16)).requires_grad_();
    const auto output = layer(input);
    EXPECT_EQ(output.sizes(), (std::vector<int64_t>{0, 512})) << what;
    EXPECT_EQ(output.scalar_type(), torch::kBFloat16) << what;
    output.sum().backward();
    ASSERT_TRUE(layer->weight.grad().defined()) << what;
    EXPECT_EQ(layer->weight.grad().abs().max().item<float>(), 0.0f) << what;
    EXPECT_EQ(input.grad().sizes(), input.sizes()) << what;
    for (const auto& amax : layer->latest_amaxes()) EXPECT_EQ(amax.item<float>(), 0.0f) << what;
  }
}

/// An fp64 input takes the ATen fallback of the casts (the kernels take
/// bf16, fp16 and fp32): with values that fp32 holds exactly, a delayed-
/// scaling layer must give the same outputs, weight gradients and amaxes over
/// several steps, its scales evolving, as the same layer fed fp32.
TEST(Float8Linear, AtenFallbackOfDelayedScalingMatchesTheKernels) {
  torch::manual_seed(6);
  const auto recipe = ddp::Float8Options().scaling(ddp::Float8Scaling::kDelayed).amax_history_len(4);
  ddp::Float8Linear kernels(torch::nn::LinearOptions(128, 64).bias(false), recipe);
  ddp::Float8Linear fallback(torch::nn::LinearOptions(128, 64).bias(false), recipe);
  kernels->to(kGpu);
  fallback->to(kGpu);
  {
    torch::NoGradGuard no_grad;
    fallback->weight.copy_(kernels->weight);
  }
  for (int step = 0; step < 4; ++step) {
    const std::string what = "step " + std::to_string(step);
    const auto x = torch::randn({32, 128}, torch::TensorOptions().device(kGpu)) * (1 + step);
    const auto grad_output = torch::randn({32, 64}, torch::TensorOptions().device(kGpu).dtype(torch::kBFloat16));
    // No input gradient: at::_scaled_mm has no fp64 output.
    const auto y32 = kernels(x);
    const auto y64 = fallback(x.to(torch::kDouble));
    y32.backward(grad_output);
    y64.backward(grad_output);
    expect_same_bytes(y64, y32, what + ", output");
    expect_same_bytes(fallback->weight.grad(), kernels->weight.grad(), what + ", weight gradient");
    const auto expected = kernels->latest_amaxes(), actual = fallback->latest_amaxes();
    for (std::size_t i = 0; i < expected.size(); ++i) {
      expect_same_bytes(actual[i], expected[i], what + ", amax " + std::to_string(i));
    }
  }
}

/// Layers sharing their input's cast (float8::share_input_cast) give the
/// bytes that layers casting it each give, outputs and gradients, under both
/// recipes and over steps in which delayed scaling's scales move; only the
/// first layer to run casts (the others' input amaxes stay zero); and a
/// tensor changed in place after the first cast, or passed again to a layer
/// that used its cast already, is cast again; inference tensors too.
TEST(Float8Linear, SharedInputCastMatchesSeparateCasts) {
  torch::manual_seed(7);
  const auto bf16 = torch::TensorOptions().device(kGpu).dtype(torch::kBFloat16);
  for (const auto scaling : {ddp::Float8Scaling::kCurrent, ddp::Float8Scaling::kDelayed}) {
    const bool delayed = scaling == ddp::Float8Scaling::kDelayed;
    const std::string recipe = delayed ? "delayed scaling" : "current scaling";
    const auto options = ddp::Float8Options().scaling(scaling).amax_history_len(4);
    std::vector<ddp::Float8Linear> shared, separate;
    for (const int64_t out : {128, 64, 64}) {
      shared.emplace_back(torch::nn::LinearOptions(256, out).bias(false), options);
      separate.emplace_back(torch::nn::LinearOptions(256, out).bias(false), options);
      shared.back()->to(kGpu);
      separate.back()->to(kGpu);
      torch::NoGradGuard no_grad;
      separate.back()->weight.copy_(shared.back()->weight);
    }
    ddp::float8::share_input_cast({shared[0].get(), shared[1].get(), shared[2].get()});
    for (int step = 0; step < 4; ++step) {
      const std::string what = recipe + ", step " + std::to_string(step);
      const auto x = (torch::randn({64, 256}, bf16) * (1 + step)).requires_grad_();
      const auto x_separate = x.detach().clone().requires_grad_();
      torch::Tensor loss_shared = torch::zeros({}, bf16), loss_separate = torch::zeros({}, bf16);
      for (std::size_t i = 0; i < shared.size(); ++i) {
        const auto y = shared[i](x), y_separate = separate[i](x_separate);
        expect_same_bytes(y, y_separate, what + ", output " + std::to_string(i));
        const auto grad = torch::randn(y.sizes(), bf16);
        loss_shared = loss_shared + (y * grad).sum();
        loss_separate = loss_separate + (y_separate * grad).sum();
      }
      loss_shared.backward();
      loss_separate.backward();
      expect_same_bytes(x.grad(), x_separate.grad(), what + ", input gradient");
      for (std::size_t i = 0; i < shared.size(); ++i) {
        expect_same_bytes(shared[i]->weight.grad(), separate[i]->weight.grad(),
                          what + ", weight gradient " + std::to_string(i));
      }
      if (delayed) {
        EXPECT_EQ(shared[0]->latest_amaxes()[0].item<float>(), x.abs().max().item<float>()) << what;
        EXPECT_EQ(shared[1]->latest_amaxes()[0].item<float>(), 0.0f) << what << ": the second layer cast its input";
        EXPECT_EQ(shared[2]->latest_amaxes()[0].item<float>(), 0.0f) << what << ": the third layer cast its input";
      }
      for (auto* layers : {&shared, &separate}) {
        for (auto& layer : *layers) layer->zero_grad();
      }
      if (::testing::Test::HasFailure()) return;
    }
    torch::NoGradGuard no_grad;
    if (delayed) {
      // A member called twice on one tensor casts it again, with the scale
      // its first call's amax moved, rather than reuse its own old cast.
      const auto w = torch::randn({64, 256}, bf16) * 50;
      for (auto* layers : {&shared, &separate}) (*layers)[0](w);
      expect_same_bytes(shared[0](w), separate[0](w), recipe + ", the first layer called twice on one tensor");
      continue;
    }
    // Changed in place between two members: the second casts the new values.
    const auto z = torch::randn({64, 256}, bf16);
    shared[0](z);
    z.mul_(3);
    expect_same_bytes(shared[1](z), separate[1](z), recipe + ", after an in-place change of the input");
    // Inference tensors have no version counter: always cast anew.
    c10::InferenceMode inference;
    const auto v = torch::randn({64, 256}, bf16);
    shared[0](v);
    expect_same_bytes(shared[1](v), separate[1](v), recipe + ", under InferenceMode");
  }
}

/// Delayed scaling takes the amax in the cast's own pass.
TEST(Float8Linear, DelayedScalingRecordsTheInputAmax) {
  torch::manual_seed(5);
  ddp::Float8Linear layer(torch::nn::LinearOptions(256, 512),
                          ddp::Float8Options().scaling(ddp::Float8Scaling::kDelayed));
  layer->to(kGpu);
  const auto input = torch::randn({64, 256}, torch::TensorOptions().device(kGpu).dtype(torch::kBFloat16));
  const auto grad_output = torch::randn({64, 512}, torch::TensorOptions().device(kGpu).dtype(torch::kBFloat16));
  layer(input.requires_grad_()).backward(grad_output);
  const auto amaxes = layer->latest_amaxes();
  ASSERT_EQ(amaxes.size(), 3u);
  EXPECT_EQ(amaxes[0].item<float>(), input.abs().max().item<float>());
  EXPECT_EQ(amaxes[1].item<float>(), layer->weight.abs().max().item<float>());
  EXPECT_EQ(amaxes[2].item<float>(), grad_output.abs().max().item<float>());
}

}  // namespace
