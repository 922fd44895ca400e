// GradScaler: the torch.amp.GradScaler contract, on the CPU; and, over Gloo,
// that an inf seen by one rank makes every rank skip the step.

#include <cmath>
#include <limits>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "support/multiprocess.h"

namespace {

/// One parameter, an SGD optimizer and a loss whose gradient is known: d(sum(w*x))/dw = x.
struct Fixture {
  torch::Tensor weight = torch::ones({4}, torch::requires_grad());
  torch::optim::SGD optimizer{{weight}, torch::optim::SGDOptions(0.1)};
  torch::Tensor x = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f});

  void backward(ddp::GradScaler& scaler, bool poison = false) {
    optimizer.zero_grad();
    scaler.scale((weight * x).sum()).backward();
    if (poison) {
      torch::NoGradGuard no_grad;
      weight.grad()[1] = std::numeric_limits<float>::infinity();
    }
  }
};

TEST(GradScaler, ScalesTheLossAndUnscalesTheGradients) {
  Fixture f;
  ddp::GradScaler scaler(ddp::GradScalerOptions().init_scale(1024));
  f.backward(scaler);
  EXPECT_TRUE(torch::allclose(f.weight.grad(), f.x * 1024));
  scaler.unscale_(f.optimizer);
  EXPECT_TRUE(torch::allclose(f.weight.grad(), f.x));
  EXPECT_TRUE(scaler.step(f.optimizer));
  EXPECT_TRUE(torch::allclose(f.weight.detach(), 1 - 0.1 * f.x));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1024);
}

TEST(GradScaler, SkipsTheStepOnInfAndBacksOff) {
  Fixture f;
  ddp::GradScaler scaler;
  f.backward(scaler, /*poison=*/true);
  EXPECT_FALSE(scaler.step(f.optimizer));
  EXPECT_TRUE(torch::equal(f.weight.detach(), torch::ones({4})));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 32768);

  f.backward(scaler);  // NaN too
  {
    torch::NoGradGuard no_grad;
    f.weight.grad()[0] = std::nan("");
  }
  EXPECT_FALSE(scaler.step(f.optimizer));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 16384);
  EXPECT_EQ(scaler.state_dict().growth_tracker, 0);
}

TEST(GradScaler, GrowsAfterGrowthIntervalCleanSteps) {
  Fixture f;
  ddp::GradScaler scaler(ddp::GradScalerOptions().init_scale(8).growth_interval(3));
  for (int step = 1; step <= 3; ++step) {
    f.backward(scaler);
    EXPECT_TRUE(scaler.step(f.optimizer));
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), step < 3 ? 8 : 16) << "after step " << step;
    EXPECT_EQ(scaler.state_dict().growth_tracker, step < 3 ? step : 0) << "after step " << step;
  }
  // An inf resets the count: three more clean steps are needed.
  f.backward(scaler);
  EXPECT_TRUE(scaler.step(f.optimizer));
  scaler.update();
  f.backward(scaler, /*poison=*/true);
  EXPECT_FALSE(scaler.step(f.optimizer));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 8);
  EXPECT_EQ(scaler.state_dict().growth_tracker, 0);
}

TEST(GradScaler, RejectsCallsOutOfOrder) {
  Fixture f;
  ddp::GradScaler scaler;
  EXPECT_THROW(scaler.unscale_(f.optimizer), ddp::UsageError);  // before scale()
  f.backward(scaler);
  scaler.unscale_(f.optimizer);
  EXPECT_THROW(scaler.unscale_(f.optimizer), ddp::UsageError);
  scaler.step(f.optimizer);
  EXPECT_THROW(scaler.step(f.optimizer), ddp::UsageError);
  scaler.update();
  EXPECT_THROW(scaler.update(), ddp::UsageError);  // no step since
  EXPECT_THROW(ddp::GradScaler(ddp::GradScalerOptions().growth_factor(0.5)), ddp::UsageError);
  EXPECT_THROW(ddp::GradScaler(ddp::GradScalerOptions().backoff_factor(1.5)), ddp::UsageError);
}

TEST(GradScaler, DisabledPassesThrough) {
  Fixture f;
  auto scaler = ddp::GradScaler::for_policy(ddp::PrecisionPolicy::parse("bf16"));
  EXPECT_FALSE(scaler.is_enabled());
  const auto loss = (f.weight * f.x).sum();
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  f.backward(scaler);
  EXPECT_TRUE(torch::allclose(f.weight.grad(), f.x));
  EXPECT_TRUE(scaler.step(f.optimizer));
  scaler.update();
  EXPECT_TRUE(torch::allclose(f.weight.detach(), 1 - 0.1 * f.x));
  EXPECT_TRUE(ddp::GradScaler::for_policy(ddp::PrecisionPolicy::parse("fp16")).is_enabled());
}

TEST(GradScaler, StateRoundTripsThroughAnArchive) {
  Fixture f;
  ddp::GradScaler scaler(ddp::GradScalerOptions().init_scale(256).growth_interval(5).growth_factor(4));
  for (int step = 0; step < 2; ++step) {
    f.backward(scaler);
    scaler.step(f.optimizer);
    scaler.update();
  }
  torch::serialize::OutputArchive out;
  scaler.save(out);
  std::stringstream stream;
  out.save_to(stream);

  ddp::GradScaler restored;
  torch::serialize::InputArchive in;
  in.load_from(stream);
  restored.load(in);
  const auto state = restored.state_dict();
  EXPECT_EQ(state.scale, 256);
  EXPECT_EQ(state.growth_tracker, 2);
  EXPECT_EQ(state.growth_factor, 4);
  EXPECT_EQ(state.growth_interval, 5);
  // The restored scaler continues the count: 3 more clean steps grow it.
  for (int step = 0; step < 3; ++step) {
    f.backward(restored);
    restored.step(f.optimizer);
    restored.update();
  }
  EXPECT_EQ(restored.get_scale(), 1024);

  torch::serialize::OutputArchive unrelated;
  unrelated.write("something_else", c10::IValue(1.0));
  std::stringstream unrelated_stream;
  unrelated.save_to(unrelated_stream);
  torch::serialize::InputArchive corrupt;
  corrupt.load_from(unrelated_stream);
  try {
    restored.load(corrupt);
    FAIL() << "a checkpoint without the scaler's state was accepted";
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'scale'"), std::string::npos) << e.what();
  }
  ddp::GradScalerState bad = state;
  bad.growth_tracker = 7;
  EXPECT_THROW(restored.load_state_dict(bad), ddp::UsageError);
}

#ifdef DDP_TEST_WITH_GLOO
TEST(GradScalerGloo, AnInfOnOneRankMakesEveryRankSkip) {
  using namespace ddp::testing;
  expect_all_succeeded(run_ranks(2, [](int rank) {
    auto pg = ddp::init(ddp::InitOptions().backend(ddp::Backend::kGloo).timeout(std::chrono::seconds(60)));
    Fixture f;
    ddp::GradScaler scaler(ddp::GradScalerOptions().growth_interval(2), pg);
    // Step 1: only rank 1 overflows; step 2 and 3: clean on both.
    for (int step = 1; step <= 3; ++step) {
      f.backward(scaler, /*poison=*/step == 1 && rank == 1);
      const bool stepped = scaler.step(f.optimizer);
      scaler.update();
      require(stepped == (step != 1), "step " + std::to_string(step) + " stepped=" + std::to_string(stepped));
    }
    require(scaler.get_scale() == 65536.0, "scale " + std::to_string(scaler.get_scale()) +
                                               ": expected a back-off to 32768 then growth to 65536");
    require(torch::allclose(f.weight.detach(), 1 - 2 * 0.1 * f.x), "weights differ from two clean steps");
  }));
}
#endif

}  // namespace
