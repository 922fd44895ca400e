// Precision policies, their guard, and Float8Linear where no FP8 can run.

#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

namespace {

TEST(Precision, ParsesEveryNameInAnyCase) {
  EXPECT_EQ(ddp::parse_precision("fp32"), ddp::Precision::kFp32);
  EXPECT_EQ(ddp::parse_precision("TF32"), ddp::Precision::kTf32);
  EXPECT_EQ(ddp::parse_precision("bf16"), ddp::Precision::kBf16);
  EXPECT_EQ(ddp::parse_precision("Fp16"), ddp::Precision::kFp16);
  EXPECT_EQ(ddp::parse_precision("fp8"), ddp::Precision::kFp8);
  for (auto precision : {ddp::Precision::kFp32, ddp::Precision::kTf32, ddp::Precision::kBf16, ddp::Precision::kFp16,
                         ddp::Precision::kFp8}) {
    EXPECT_EQ(ddp::parse_precision(ddp::to_string(precision)), precision);
  }
}

TEST(Precision, UnknownNameNamesTheChoices) {
  try {
    ddp::parse_precision("fp64");
    FAIL() << "fp64 was accepted";
  } catch (const ddp::UsageError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("'fp64'"), std::string::npos) << message;
    EXPECT_NE(message.find("fp32, tf32, bf16, fp16, fp8"), std::string::npos) << message;
  }
  EXPECT_THROW(ddp::parse_precision(""), ddp::UsageError);
}

TEST(Precision, PolicySaysWhatEachPrecisionMeans) {
  const ddp::PrecisionPolicy fp32(ddp::Precision::kFp32);
  EXPECT_FALSE(fp32.autocast_dtype().has_value());
  EXPECT_FALSE(fp32.allow_tf32());
  const auto tf32 = ddp::PrecisionPolicy::parse("tf32");
  EXPECT_FALSE(tf32.autocast_dtype().has_value());
  EXPECT_TRUE(tf32.allow_tf32());
  const auto bf16 = ddp::PrecisionPolicy::parse("bf16");
  EXPECT_EQ(bf16.autocast_dtype(), torch::kBFloat16);
  EXPECT_FALSE(bf16.needs_grad_scaler());
  const auto fp16 = ddp::PrecisionPolicy::parse("fp16");
  EXPECT_EQ(fp16.autocast_dtype(), torch::kHalf);
  EXPECT_TRUE(fp16.needs_grad_scaler());
  const auto fp8 = ddp::PrecisionPolicy::parse("fp8");
  EXPECT_EQ(fp8.autocast_dtype(), torch::kBFloat16);
  EXPECT_TRUE(fp8.uses_float8());
  EXPECT_EQ(fp8.gradient_reduce_dtype(), torch::kFloat);
  auto compressed = ddp::PrecisionPolicy::parse("bf16");
  EXPECT_EQ(compressed.gradient_reduce_dtype(torch::kBFloat16).gradient_reduce_dtype(), torch::kBFloat16);
  EXPECT_THROW(compressed.gradient_reduce_dtype(torch::kInt), ddp::UsageError);
}

TEST(Precision, GpuOnlyPoliciesAreRefusedOnTheCpu) {
  EXPECT_NO_THROW(ddp::PrecisionPolicy::parse("bf16").check_supported(torch::kCPU));
  EXPECT_THROW(ddp::PrecisionPolicy::parse("fp16").check_supported(torch::kCPU), ddp::UsageError);
  try {
    ddp::PrecisionPolicy::parse("fp8").check_supported(torch::kCPU);
    FAIL() << "fp8 on the CPU was accepted";
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
  // A guard refuses them too (fp16 failed in ATen's autocast, fp8 ran as bf16).
  EXPECT_THROW(ddp::PrecisionGuard(ddp::PrecisionPolicy::parse("fp16"), torch::kCPU), ddp::UsageError);
  EXPECT_THROW(ddp::PrecisionGuard(ddp::PrecisionPolicy::parse("fp8"), torch::kCPU), ddp::UsageError);
  EXPECT_FALSE(ddp::AutocastState::current(c10::kCPU).enabled) << "a refused guard left autocast on";
}

TEST(PrecisionGuard, Bf16AutocastsAMatmulOnTheCpuAndRestoresTheState) {
  const auto a = torch::randn({8, 8});
  const auto b = torch::randn({8, 8});
  ASSERT_EQ(torch::matmul(a, b).scalar_type(), torch::kFloat);
  const bool tf32_before = at::globalContext().allowTF32CuBLAS();
  {
    ddp::PrecisionGuard guard(ddp::PrecisionPolicy::parse("bf16"), torch::kCPU);
    EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(at::globalContext().allowTF32CuBLAS());
    {
      ddp::PrecisionGuard inner(ddp::PrecisionPolicy::parse("fp32"), torch::kCPU);
      EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kFloat);
      EXPECT_FALSE(at::globalContext().allowTF32CuBLAS());
    }
    EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kFloat);
  EXPECT_EQ(at::globalContext().allowTF32CuBLAS(), tf32_before);
}

TEST(PrecisionGuard, Tf32SwitchesAreSetAndRestored) {
  auto& context = at::globalContext();
  context.setAllowTF32CuBLAS(false);
  context.setAllowTF32CuDNN(true);
  {
    ddp::PrecisionGuard guard(ddp::PrecisionPolicy::parse("tf32"), torch::kCPU);
    EXPECT_TRUE(context.allowTF32CuBLAS());
    EXPECT_TRUE(context.allowTF32CuDNN());
  }
  {
    ddp::PrecisionGuard guard(ddp::PrecisionPolicy::parse("fp32"), torch::kCPU);
    EXPECT_FALSE(context.allowTF32CuBLAS());
    EXPECT_FALSE(context.allowTF32CuDNN());
  }
  EXPECT_FALSE(context.allowTF32CuBLAS());
  EXPECT_TRUE(context.allowTF32CuDNN());
}

TEST(Float8Linear, DisabledIsExactlyALinearWithTheSameKeys) {
  torch::manual_seed(3);
  torch::nn::Linear linear(32, 48);
  torch::manual_seed(3);
  ddp::Float8Linear float8(torch::nn::LinearOptions(32, 48), ddp::Float8Options().enabled(false));
  ASSERT_EQ(linear->named_parameters().keys(), float8->named_parameters().keys());
  EXPECT_TRUE(torch::equal(linear->weight, float8->weight));
  EXPECT_TRUE(torch::equal(linear->bias, float8->bias));
  const auto x = torch::randn({5, 32});
  EXPECT_TRUE(torch::equal(linear(x), float8(x)));

  // A Linear's checkpoint loads into a Float8Linear.
  std::stringstream stream;
  torch::nn::Linear other(32, 48);
  torch::save(other, stream);
  torch::load(float8, stream);
  EXPECT_TRUE(torch::equal(other->weight, float8->weight));
}

TEST(Float8Linear, RefusesToRunWhereFp8CannotRun) {
  ddp::Float8Linear layer(32, 48);
  try {
    layer(torch::randn({16, 32}));
    FAIL() << "an FP8 matmul ran on the CPU";
  } catch (const ddp::UsageError& e) {
    const std::string message = e.what();
    EXPECT_TRUE(message.find("LibTorch >= 2.4") != std::string::npos || message.find("CUDA GPU") != std::string::npos)
        << message;
  }
  EXPECT_THROW(ddp::Float8Linear(30, 48)->set_float8_enabled(true), ddp::UsageError);
}

struct Block : torch::nn::Module {
  Block() {
    up = register_module("up", ddp::Float8Linear(torch::nn::LinearOptions(64, 128),
                                                 ddp::Float8Options().enabled(false)));
    down = register_module("down", ddp::Float8Linear(torch::nn::LinearOptions(128, 64),
                                                     ddp::Float8Options().enabled(false)));
    odd = register_module("odd", ddp::Float8Linear(torch::nn::LinearOptions(64, 10),
                                                   ddp::Float8Options().enabled(false)));
    head = register_module("head", torch::nn::Linear(64, 16));
  }
  ddp::Float8Linear up{nullptr}, down{nullptr}, odd{nullptr};
  torch::nn::Linear head{nullptr};
};

TEST(Float8Linear, SharingTheInputCastNeedsOneInputWidth) {
  ddp::Float8Linear a(64, 32), b(64, 16), c(48, 32);
  EXPECT_NO_THROW(ddp::float8::share_input_cast({a.get(), b.get()}));
  try {
    ddp::float8::share_input_cast({a.get(), c.get()});
    ADD_FAILURE() << "layers of input widths 64 and 48 shared a cast";
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("different widths (64 and 48)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ddp::float8::share_input_cast({a.get(), nullptr}), ddp::UsageError);
}

TEST(Float8Conversion, EnablesQualifyingLayersAndReportsTheRest) {
  Block block;
  const auto report = ddp::float8::enable_float8(
      block, ddp::Float8Options().scaling(ddp::Float8Scaling::kDelayed).amax_history_len(16),
      [](const std::string& path, const ddp::Float8LinearImpl&) { return path != "down"; });
  EXPECT_EQ(report.converted, std::vector<std::string>{"up"});
  ASSERT_EQ(report.skipped.size(), 3u);
  std::map<std::string, std::string> why(report.skipped.begin(), report.skipped.end());
  EXPECT_EQ(why.at("down"), "excluded by the filter");
  EXPECT_NE(why.at("odd").find("multiples of 16"), std::string::npos);
  EXPECT_NE(why.at("head").find("declare it as ddp::Float8Linear"), std::string::npos);
  EXPECT_TRUE(block.up->float8_enabled());
  EXPECT_EQ(block.up->float8_options.scaling(), ddp::Float8Scaling::kDelayed);
  EXPECT_FALSE(block.down->float8_enabled());
  EXPECT_FALSE(block.odd->float8_enabled());
}

}  // namespace
