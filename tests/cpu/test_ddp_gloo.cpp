// DistributedDataParallel over Gloo, in real processes of 1, 2 and 4 ranks:
// N ranks with batch B reach the parameters of one process that accumulates
// the gradients of the same N batches.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "support/collective_checks.h"
#include "support/ddp_scenarios.h"
#include "support/multiprocess.h"

namespace {

using namespace ddp::testing;

std::shared_ptr<ddp::ProcessGroup> init_gloo() {
  return ddp::init(ddp::InitOptions().backend(ddp::Backend::kGloo).timeout(std::chrono::seconds(60)));
}

class DdpGloo : public ::testing::TestWithParam<int> {};

TEST_P(DdpGloo, MlpMatchesSingleProcess) {
  expect_all_succeeded(run_ranks(GetParam(), [](int) {
    auto pg = init_gloo();
    check_matches_single_process(*pg, Scenario{});
    Scenario scenario;
    scenario.options.static_graph(true).find_unused_parameters(true);
    check_matches_single_process(*pg, scenario);
  }));
}

TEST_P(DdpGloo, WeightsLoadedAfterWrappingAreStillReduced) {
  expect_all_succeeded(run_ranks(GetParam(), [](int) {
    auto pg = init_gloo();
    Scenario scenario;
    scenario.model = Model::kConvBatchNorm;
    scenario.channels_last = true;
    scenario.load_after_wrapping = true;
    check_matches_single_process(*pg, scenario);
  }));
}

TEST_P(DdpGloo, ConvNetWithBatchNormMatchesSingleProcess) {
  expect_all_succeeded(run_ranks(GetParam(), [](int) {
    auto pg = init_gloo();
    Scenario scenario;
    scenario.model = Model::kConvBatchNorm;
    check_matches_single_process(*pg, scenario);
    scenario.channels_last = true;
    check_matches_single_process(*pg, scenario);
  }));
}

TEST_P(DdpGloo, UnusedBranchWithFindUnusedParametersMatchesSingleProcess) {
  expect_all_succeeded(run_ranks(GetParam(), [](int) {
    auto pg = init_gloo();
    Scenario scenario;
    scenario.model = Model::kBranchy;
    scenario.steps = 4;
    scenario.options.find_unused_parameters(true);
    check_matches_single_process(*pg, scenario);
    scenario.options.gradient_as_bucket_view(false);
    check_matches_single_process(*pg, scenario);
  }));
}

TEST_P(DdpGloo, GradientAccumulationWithNoSyncMatchesSingleProcess) {
  expect_all_succeeded(run_ranks(GetParam(), [](int) {
    auto pg = init_gloo();
    Scenario scenario;
    scenario.micro_steps = 3;
    check_matches_single_process(*pg, scenario);
    scenario.model = Model::kConvBatchNorm;
    scenario.options.gradient_as_bucket_view(false);
    check_matches_single_process(*pg, scenario);
  }));
}

TEST_P(DdpGloo, BucketSizesFromTinyToOneBucketGiveTheSameResult) {
  expect_all_succeeded(run_ranks(GetParam(), [](int) {
    auto pg = init_gloo();
    Scenario scenario;
    scenario.model = Model::kConvBatchNorm;
    std::size_t buckets = 0;
    scenario.options.bucket_cap_mb(1e-6).first_bucket_cap_mb(1e-6);
    check_matches_single_process(*pg, scenario, &buckets);
    require(buckets == 6, "tiny buckets: expected one per parameter (6), got " + std::to_string(buckets));
    scenario.options.bucket_cap_mb(1000).first_bucket_cap_mb(1000);
    check_matches_single_process(*pg, scenario, &buckets);
    require(buckets == 1, "huge buckets: expected 1, got " + std::to_string(buckets));
    scenario.options.bucket_cap_mb(0.0005).first_bucket_cap_mb(0.0001);
    check_matches_single_process(*pg, scenario, &buckets);
    require(buckets > 1 && buckets < 6, "mid-size buckets: got " + std::to_string(buckets));
  }));
}

// LibTorch 2.x hands `shift` a view of the output gradient that the head's
// backward reads after shift's bucket is reduced: reducing a gradient where
// autograd put it would change the head's gradients (LibTorch 1.13 gives
// shift memory of its own, so there this guards the scenario, not the race).
TEST_P(DdpGloo, ParameterUsedThroughAViewMatchesSingleProcess) {
  expect_all_succeeded(run_ranks(GetParam(), [](int) {
    auto pg = init_gloo();
    Scenario scenario;
    scenario.model = Model::kViewedParameter;
    scenario.options.bucket_cap_mb(1e-6).first_bucket_cap_mb(1e-6);
    check_matches_single_process(*pg, scenario);
  }));
}

TEST_P(DdpGloo, Bf16CompressionStaysClose) {
  expect_all_succeeded(run_ranks(GetParam(), [](int) {
    auto pg = init_gloo();
    Scenario scenario;
    scenario.options.comm_hook(ddp::comm_hooks::average_in(torch::kBFloat16));
    scenario.tolerance = 1e-2;
    check_matches_single_process(*pg, scenario);
  }));
}

TEST_P(DdpGloo, MismatchedModelsAreReportedOnEveryRank) {
  expect_all_succeeded(run_ranks(GetParam(), [](int) { check_model_mismatch_is_reported(*init_gloo()); }));
}

// Layer b only where the caller asks for it.
struct TwoLayersImpl : torch::nn::Module {
  TwoLayersImpl() {
    a = register_module("a", torch::nn::Linear(4, 4));
    b = register_module("b", torch::nn::Linear(4, 4));
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_b) { return use_b ? b(a(x)) : a(x); }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(TwoLayers);

// With find_unused_parameters, a parameter that got its gradient only in a
// no_sync micro-batch, on some ranks, is still averaged by the synchronised
// backward (whose own forward did not use it): every rank steps it as one
// process would. Before, rank 0 stepped its own gradient and rank 1 none.
TEST(DdpGlooTwoRanks, AParameterUsedOnlyUnderNoSyncIsAveragedAtTheSynchronisedBackward) {
  expect_all_succeeded(run_ranks(2, [](int rank) {
    auto pg = init_gloo();
    torch::manual_seed(0);
    TwoLayers net, reference;
    {
      torch::NoGradGuard no_grad;
      for (auto& item : reference->named_parameters()) item.value().copy_(net->named_parameters()[item.key()]);
    }
    ddp::DistributedDataParallel<TwoLayers> model(net, pg,
                                                  ddp::DistributedDataParallelOptions().find_unused_parameters(true));
    torch::optim::SGD optimizer(model.parameters(), 0.1), reference_optimizer(reference->parameters(), 0.1);
    const auto batch = [](int of_rank, int micro) {
      return torch::linspace(-1, 1, 8).view({2, 4}) * (1 + of_rank + 2 * micro);
    };
    for (int step = 0; step < 2; ++step) {
      optimizer.zero_grad();
      {
        auto guard = model.no_sync();
        model(batch(rank, 0), /*use_b=*/rank == 0).sum().backward();
      }
      model(batch(rank, 1), /*use_b=*/false).sum().backward();
      optimizer.step();
      // One process: every rank's micro-batches, the loss averaged over the ranks.
      reference_optimizer.zero_grad();
      for (int r = 0; r < 2; ++r) {
        (reference(batch(r, 0), r == 0).sum() / 2).backward();
        (reference(batch(r, 1), false).sum() / 2).backward();
      }
      reference_optimizer.step();
    }
    for (const auto& item : reference->named_parameters()) {
      require(torch::allclose(net->named_parameters()[item.key()], item.value(), 1e-5, 1e-6),
              "rank " + std::to_string(rank) + ": '" + item.key() + "' differs from one process");
    }
  }));
}

// Rank 0's copy overwrites every parameter and buffer, so they must agree
// too, not only the trained parameters: a buffer or frozen parameter of
// another shape, or a gradient sparse on one rank only, is refused on every
// rank, and so is a rank with nothing to train, at once (it does not leave
// the others waiting in the check).
TEST(DdpGlooTwoRanks, MismatchedBuffersFrozenParametersAndSparseGradientsAreReportedOnEveryRank) {
  expect_all_succeeded(run_ranks(2, [](int rank) {
    auto pg = ddp::init(ddp::InitOptions().backend(ddp::Backend::kGloo).timeout(std::chrono::seconds(60)));
    const auto refused = [&](const torch::nn::Sequential& model, const std::string& expected) {
      const auto start = std::chrono::steady_clock::now();
      try {
        ddp::DistributedDataParallel<torch::nn::Sequential> wrapped(model, pg);
      } catch (const ddp::UsageError& e) {
        require_contains(e.what(), expected);
        require(std::chrono::steady_clock::now() - start < std::chrono::seconds(10), "refused only after a timeout");
        return;
      }
      throw std::runtime_error("rank " + std::to_string(rank) + " accepted a model that differs: " + expected);
    };
    torch::nn::Sequential buffers(torch::nn::Linear(4, 3));
    buffers->register_buffer("a", torch::zeros({rank == 0 ? 3 : 2}));
    refused(buffers, "rank 1: #2: rank 0 has buffer 'a' [3] Float, rank 1 has buffer 'a' [2] Float");
    torch::nn::Sequential frozen(torch::nn::Linear(4, 3), torch::nn::Linear(3, 2));
    if (rank == 1) frozen[0]->parameters()[0].requires_grad_(false);
    refused(frozen, "rank 0 has parameter '0.weight' [3, 4] Float, rank 1 has frozen parameter '0.weight'");
    torch::nn::Sequential nothing_to_train(torch::nn::Linear(4, 3));
    if (rank == 1) {
      for (auto& parameter : nothing_to_train->parameters()) parameter.requires_grad_(false);
    }
    refused(nothing_to_train, "rank 1: #0: rank 0 has parameter '0.weight' [3, 4] Float, rank 1 has frozen");
    torch::nn::Sequential sparse_on_one(torch::nn::Embedding(torch::nn::EmbeddingOptions(8, 3).sparse(rank == 1)),
                                        torch::nn::Linear(3, 2));
    refused(
        sparse_on_one,
        "rank 1: #0: rank 0 has parameter '0.weight' [8, 3] Float, rank 1 has sparse-gradient parameter '0.weight'");
  }));
}

TEST_P(DdpGloo, UnusedParameterWithoutTheOptionIsReported) {
  expect_all_succeeded(run_ranks(GetParam(), [](int) { check_unused_parameter_is_reported(*init_gloo()); }));
}

// A module whose output shows its buffers: two float vectors, which DDP packs
// side by side, and an integer counter.
struct BufferedNetImpl : torch::nn::Module {
  BufferedNetImpl() {
    linear = register_module("linear", torch::nn::Linear(4, 4));
    offset = register_buffer("offset", torch::zeros({4}));
    shift = register_buffer("shift", torch::zeros({2}));
    count = register_buffer("count", torch::zeros({}, torch::kLong));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return linear(x) + offset.narrow(0, 0, 4) + shift.sum() + count.to(torch::kFloat);
  }
  torch::nn::Linear linear{nullptr};
  torch::Tensor offset, shift, count;
};
TORCH_MODULE(BufferedNet);

// Before each training forward every rank gets rank 0's buffers, whether a
// rank changed them in place or replaced their storage (as Module::load
// does); in evaluation each rank keeps its own.
TEST_P(DdpGloo, BuffersFollowRankZeroBeforeEachTrainingForward) {
  expect_all_succeeded(run_ranks(GetParam(), [](int rank) {
    auto pg = init_gloo();
    BufferedNet net;
    ddp::DistributedDataParallel<BufferedNet> model(net, pg);
    const auto expect_buffers = [&](float offset, std::int64_t count, const std::string& when) {
      const float got_offset = net->offset[3].item<float>();
      const std::int64_t got_count = net->count.item<std::int64_t>();
      require(got_offset == offset && got_count == count,
              when + ": rank " + std::to_string(rank) + " has offset " + std::to_string(got_offset) + " and count " +
                  std::to_string(got_count) + ", expected " + std::to_string(offset) + " and " + std::to_string(count));
    };
    {
      torch::NoGradGuard no_grad;
      net->offset.fill_(0.5 + rank);
      net->count.fill_(7 + rank);
    }
    model(torch::zeros({2, 4}));
    expect_buffers(0.5F, 7, "changed in place");
    {
      torch::NoGradGuard no_grad;
      net->offset.set_(torch::full({4}, 10.0F + static_cast<float>(rank)));
      net->count.set_(torch::full({}, 20 + rank, torch::kLong));
    }
    model(torch::zeros({2, 4}));
    expect_buffers(10.0F, 20, "replaced");
    model(torch::zeros({2, 4}));
    expect_buffers(10.0F, 20, "replaced, next forward");
    net->eval();
    {
      torch::NoGradGuard no_grad;
      net->offset.fill_(30.0F + static_cast<float>(rank));
    }
    model(torch::zeros({2, 4}));
    expect_buffers(30.0F + static_cast<float>(rank), 20, "evaluation");
  }));
}

// DDP packs same-dtype buffers side by side. One grown in place (resize_
// keeps its pointer while the packed memory is large enough) overlaps its
// neighbour until the next training forward, which packs them anew.
TEST_P(DdpGloo, BufferGrownInPlaceIsRepackedByTheNextForward) {
  expect_all_succeeded(run_ranks(GetParam(), [](int rank) {
    auto pg = init_gloo();
    BufferedNet net;
    ddp::DistributedDataParallel<BufferedNet> model(net, pg);
    net->offset.resize_({6});
    model(torch::zeros({2, 4}));
    {
      torch::NoGradGuard no_grad;
      net->offset.fill_(1.0F + static_cast<float>(rank));
      net->shift.fill_(-1.0F - static_cast<float>(rank));
    }
    model(torch::zeros({2, 4}));
    const bool offset_ok = net->offset.numel() == 6 && torch::equal(net->offset, torch::full({6}, 1.0F));
    const bool shift_ok = torch::equal(net->shift, torch::full({2}, -1.0F));
    require(offset_ok && shift_ok, "rank " + std::to_string(rank) + ": buffers after the forward: offset " +
                                       c10::str(net->offset) + ", shift " + c10::str(net->shift) +
                                       "; expected rank 0's: 1 x6 and -1 x2");
  }));
}

// On one process a gradient's average is itself, so DDP copies and launches
// nothing; it must still train exactly as the module alone, also where
// gradients are not bucket views (finalize copies nothing back then) and
// where parameters go unused.
TEST(DdpGlooOneRank, TrainsAsTheModuleAlone) {
  expect_all_succeeded(run_ranks(1, [](int) {
    auto pg = init_gloo();
    check_matches_single_process(*pg, Scenario{});
    Scenario accumulated;
    accumulated.model = Model::kConvBatchNorm;
    accumulated.micro_steps = 3;
    accumulated.options.gradient_as_bucket_view(false);
    check_matches_single_process(*pg, accumulated);
    Scenario branchy;
    branchy.model = Model::kBranchy;
    branchy.steps = 4;
    branchy.options.find_unused_parameters(true);
    check_matches_single_process(*pg, branchy);
    check_unused_parameter_is_reported(*pg);
  }));
}

// A parameter frozen after wrapping crashed the next forward (a null
// gradient accumulator), and a comm hook that returned no function failed
// with a bare std::bad_function_call: both are UsageErrors that say so.
TEST(DdpGlooTwoRanks, FreezingAfterWrappingAndAnEmptyCommHookAreUsageErrors) {
  expect_all_succeeded(run_ranks(2, [](int) {
    auto pg = init_gloo();
    torch::nn::Linear linear(4, 3);
    ddp::DistributedDataParallel<torch::nn::Linear> model(linear, pg);
    model(torch::ones({2, 4})).sum().backward();
    linear->bias.requires_grad_(false);
    require_usage_error(
        [&] {
          model(torch::ones({2, 4})).sum().backward();
        },
        "parameter 'bias' no longer requires a gradient");

    ddp::DistributedDataParallel<torch::nn::Linear> hooked(
        torch::nn::Linear(4, 3), pg,
        ddp::DistributedDataParallelOptions().comm_hook(
            [](ddp::Communicator&, const ddp::GradBucket&) -> std::function<void()> { return nullptr; }));
    require_usage_error(
        [&] {
          hooked(torch::ones({2, 4})).sum().backward();
        },
        "the comm hook returned an empty function for bucket 0");
  }));
}

struct TwoHeadsImpl : torch::nn::Module {
  TwoHeadsImpl()
      : first(register_module("first", torch::nn::Linear(4, 2))),
        second(register_module("second", torch::nn::Linear(4, 2))) {}
  torch::Tensor forward(const torch::Tensor& x, bool use_second) {
    return use_second ? first(x) + second(x) : first(x);
  }
  torch::nn::Linear first, second;
};
TORCH_MODULE(TwoHeads);

// static_graph with find_unused_parameters: an iteration that leaves out a parameter the first one used breaks
// the promise; the error said to set find_unused_parameters, which was set.
TEST(DdpGlooTwoRanks, AGraphThatChangesUnderStaticGraphIsNamedAsSuch) {
  expect_all_succeeded(run_ranks(2, [](int) {
    auto pg = init_gloo();
    ddp::DistributedDataParallel<TwoHeads> model(
        TwoHeads(), pg, ddp::DistributedDataParallelOptions().static_graph(true).find_unused_parameters(true));
    for (int iteration = 0; iteration < 2; ++iteration) model(torch::ones({2, 4}), true).sum().backward();
    require_usage_error(
        [&] {
          model(torch::ones({2, 4}), false).sum().backward();
        },
        "though the first iteration used them: second.weight, second.bias. static_graph promises");
  }));
}

// A forward under NoGradGuard between a forward and its backward (a target,
// a pseudo-label) disarmed the reducer: that backward was not averaged, and
// the ranks drifted apart silently. Three iterations: the second rebuilds
// the buckets.
TEST(DdpGlooTwoRanks, ANoGradForwardBetweenAForwardAndItsBackwardLeavesItAveraged) {
  expect_all_succeeded(run_ranks(2, [](int rank) {
    auto pg = init_gloo();
    ddp::DistributedDataParallel<torch::nn::Linear> model(torch::nn::Linear(4, 3), pg);
    for (int iteration = 0; iteration < 3; ++iteration) {
      for (auto& parameter : model.parameters()) parameter.mutable_grad() = at::Tensor();
      at::Tensor loss = model(torch::full({2, 4}, static_cast<double>(rank + 1))).sum();
      {
        torch::NoGradGuard no_grad;
        model(torch::ones({2, 4}));
      }
      loss.backward();
      // d(sum of outputs)/dW = the batch's column sums, 2 (rank + 1): averaged, 3; the bias's, 2.
      require(model.module()->weight.grad().eq(3).all().item<bool>(),
              "iteration " + std::to_string(iteration) + ": the weight's gradient is not the ranks' average");
      require(model.module()->bias.grad().eq(2).all().item<bool>(), "the bias's gradient is not the average");
    }
  }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, DdpGloo, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

}  // namespace
