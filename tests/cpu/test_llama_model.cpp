// The examples' LLaMA decoder: preset sizes, causality, grouped-query
// attention, exact activation checkpointing, and that it learns.

#include <cmath>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/float8.h>
#include <ddp/precision.h>

#include "llama_model.h"

namespace {

using llama::Llama;
using llama::LlamaConfig;

std::int64_t count_parameters(torch::nn::Module& model) {
  std::int64_t count = 0;
  for (const auto& p : model.parameters()) count += p.numel();
  return count;
}

double max_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

torch::Tensor random_tokens(const LlamaConfig& config, std::int64_t batch, std::int64_t seq) {
  return torch::randint(config.vocab_size, {batch, seq}, torch::kLong);
}

torch::Tensor next_token_loss(Llama& model, const torch::Tensor& tokens) {
  const torch::Tensor inputs = tokens.narrow(1, 0, tokens.size(1) - 1);
  const torch::Tensor targets = tokens.narrow(1, 1, tokens.size(1) - 1);
  const torch::Tensor logits = model->forward(inputs);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat),
                                              targets.reshape({-1}));
}

bool graph_has_node(const torch::Tensor& tensor, const std::string& name_part) {
  // Raw pointers: the graph lives as long as `tensor`, and the owning pointer
  // types differ between LibTorch versions.
  std::vector<torch::autograd::Node*> pending{tensor.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  while (!pending.empty()) {
    torch::autograd::Node* node = pending.back();
    pending.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    if (node->name().find(name_part) != std::string::npos) return true;
    for (const auto& edge : node->next_edges()) pending.push_back(edge.function.get());
  }
  return false;
}

TEST(LlamaConfig, ClosedFormCountsMatchThePublishedSizes) {
  EXPECT_EQ(LlamaConfig::preset("tinyllama-1.1b").parameter_count(), 1'100'048'384);
  EXPECT_EQ(LlamaConfig::preset("llama2-7b").parameter_count(), 6'738'415'616);
  // 256 * 64 * 2 + 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 176 + 2 * 64) + 64
  EXPECT_EQ(LlamaConfig::preset("tiny").parameter_count(), 125'248);
  auto tied = LlamaConfig::preset("tiny");
  tied.tie_embeddings = true;
  EXPECT_EQ(tied.parameter_count(), 125'248 - 256 * 64);
}

TEST(LlamaConfig, UnknownPresetNamesTheValidOnes) {
  try {
    LlamaConfig::preset("gpt5");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    for (const char* name : {"gpt5", "tiny", "tinyllama-1.1b", "llama2-7b"}) {
      EXPECT_NE(message.find(name), std::string::npos) << message;
    }
  }
}

TEST(LlamaConfig, InconsistentDimensionsAreRejected) {
  auto config = LlamaConfig::preset("tiny");
  config.n_kv_heads = 3;  // does not divide 4 heads
  EXPECT_THROW(Llama{config}, std::invalid_argument);
  config = LlamaConfig::preset("tiny");
  config.dim = 36;  // head_dim 9: RoPE needs pairs
  EXPECT_THROW(Llama{config}, std::invalid_argument);
  config = LlamaConfig::preset("tiny");
  config.ffn_hidden = 0;
  EXPECT_THROW(Llama{config}, std::invalid_argument);
}

TEST(RMSNorm, NormalisesInFp32AndKeepsTheInputsDtype) {
  llama::RMSNorm norm(16, 1e-5);
  {
    torch::NoGradGuard no_grad;
    norm->weight.uniform_(0.5, 1.5);
  }
  const torch::Tensor x = torch::randn({3, 16}, torch::kDouble) * 4;
  const torch::Tensor expected = x * torch::rsqrt(x.pow(2).mean(-1, true) + 1e-5) * norm->weight.to(torch::kDouble);
  EXPECT_LE(max_difference(norm(x.to(torch::kFloat)).to(torch::kDouble), expected), 1e-5);
  const torch::Tensor half = norm(x.to(torch::kBFloat16));
  EXPECT_EQ(half.scalar_type(), torch::kBFloat16);
  EXPECT_LE(max_difference(half.to(torch::kDouble), expected), 2e-2);
}

// Meta's formulation: feature pairs as complex numbers, multiplied by
// e^(i * position * theta^(-2k / head_dim)).
TEST(RotaryEmbedding, RotatesFeaturePairsByPositionTimesFrequency) {
  const std::int64_t head_dim = 8, seq = 5;
  llama::RotaryEmbedding rotary(head_dim, /*max_seq_len=*/16, /*theta=*/10000);
  const torch::Tensor x = torch::randn({2, seq, 3, head_dim});
  const torch::Tensor frequencies =
      torch::pow(10000.0, -torch::arange(0, head_dim, 2, torch::kDouble) / static_cast<double>(head_dim));
  const torch::Tensor angles = torch::outer(torch::arange(seq, torch::kDouble), frequencies).to(torch::kFloat);
  const torch::Tensor turn = torch::polar(torch::ones_like(angles), angles).view({1, seq, 1, head_dim / 2});
  const torch::Tensor expected =
      torch::view_as_real(torch::view_as_complex(x.reshape({2, seq, 3, head_dim / 2, 2})) * turn).flatten(-2);
  EXPECT_LE(max_difference(rotary.rotation(seq, torch::kCPU).apply(x), expected), 1e-5);
}

TEST(Llama, ParameterCountEqualsTheClosedForm) {
  auto tiny = LlamaConfig::preset("tiny");
  Llama model(tiny);
  EXPECT_EQ(count_parameters(*model), tiny.parameter_count());

  tiny.tie_embeddings = true;
  Llama tied(tiny);
  EXPECT_EQ(count_parameters(*tied), tiny.parameter_count());
  EXPECT_FALSE(tied->named_parameters().contains("output.weight"));

  // LLaMA-2-7B's structure (multi-head attention, its FFN ratio) at a size a
  // test can build.
  auto small_7b = LlamaConfig::preset("llama2-7b");
  small_7b.dim = 128;
  small_7b.n_heads = small_7b.n_kv_heads = 8;
  small_7b.ffn_hidden = 344;
  small_7b.n_layers = 2;
  small_7b.vocab_size = 512;
  Llama small(small_7b);
  EXPECT_EQ(count_parameters(*small), small_7b.parameter_count());
}

TEST(Llama, TinyLlamaHas1_1BParameters) {
  const auto config = LlamaConfig::preset("tinyllama-1.1b");
  Llama model(config);
  EXPECT_EQ(count_parameters(*model), 1'100'048'384);
}

TEST(Llama, HasMetasNamesAndFloat8LinearsWithFp8Off) {
  auto config = LlamaConfig::preset("tiny");
  config.fused_qkv = false;  // Meta's wq, wk, wv
  Llama model(config);
  std::int64_t float8_layers = 0;
  for (const auto& item : model->named_modules("", /*include_self=*/false)) {
    EXPECT_EQ(item.value()->as<torch::nn::Linear>(), nullptr) << item.key();
    if (const auto* layer = item.value()->as<ddp::Float8Linear>()) {
      ++float8_layers;
      EXPECT_FALSE(layer->float8_enabled()) << item.key();
      EXPECT_FALSE(layer->options.bias()) << item.key();
    }
  }
  EXPECT_EQ(float8_layers, 7 * config.n_layers + 1);
  const auto names = model->named_parameters();
  for (const char* name : {"tok_embeddings.weight", "layers.0.attention.wq.weight", "layers.1.attention.wk.weight",
                           "layers.0.attention.wv.weight", "layers.0.attention.wo.weight",
                           "layers.1.feed_forward.w1.weight", "layers.0.feed_forward.w2.weight",
                           "layers.0.feed_forward.w3.weight", "layers.0.attention_norm.weight",
                           "layers.0.ffn_norm.weight", "norm.weight", "output.weight"}) {
    EXPECT_TRUE(names.contains(name)) << name;
  }
  // The rotary tables are not state: nothing for checkpoints or DDP's broadcast.
  EXPECT_TRUE(model->buffers().empty());

  config.fused_qkv = true;  // the default: one projection in their place
  Llama fused(config);
  const auto fused_names = fused->named_parameters();
  EXPECT_TRUE(fused_names.contains("layers.0.attention.wqkv.weight"));
  EXPECT_FALSE(fused_names.contains("layers.0.attention.wq.weight"));
  EXPECT_EQ(fused->modules(/*include_self=*/false).size() + 2 * config.n_layers,
            model->modules(/*include_self=*/false).size());
}

TEST(Llama, InitialisationIsSeededAndSmall) {
  const auto config = LlamaConfig::preset("tiny");
  torch::manual_seed(1);
  Llama first(config);
  torch::manual_seed(1);
  Llama second(config);
  torch::manual_seed(2);
  Llama third(config);
  const auto a = first->named_parameters();
  const auto b = second->named_parameters();
  for (const auto& item : a) EXPECT_TRUE(torch::equal(item.value(), b[item.key()])) << item.key();
  EXPECT_FALSE(
      torch::equal(a["layers.0.attention.wqkv.weight"], third->named_parameters()["layers.0.attention.wqkv.weight"]));

  EXPECT_NEAR(a["tok_embeddings.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(a["layers.0.feed_forward.w1.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(a["output.weight"].std().item<double>(), 0.02, 0.002);
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layers));
  EXPECT_NEAR(a["layers.1.attention.wo.weight"].std().item<double>(), residual_std, 0.1 * residual_std);
  EXPECT_NEAR(a["layers.1.feed_forward.w2.weight"].std().item<double>(), residual_std, 0.1 * residual_std);
  EXPECT_TRUE(torch::equal(a["layers.0.ffn_norm.weight"], torch::ones({config.dim})));

  // Small logits: the untrained model guesses uniformly.
  const double loss = next_token_loss(first, random_tokens(config, 4, 33)).item<double>();
  EXPECT_NEAR(loss, std::log(static_cast<double>(config.vocab_size)), 0.1);
}

TEST(Llama, LogitsHaveShapeBatchSeqVocab) {
  const auto config = LlamaConfig::preset("tiny");
  Llama model(config);
  const torch::Tensor logits = model->forward(random_tokens(config, 3, 17));
  EXPECT_EQ(logits.sizes(), (std::vector<std::int64_t>{3, 17, config.vocab_size}));
  EXPECT_EQ(logits.scalar_type(), torch::kFloat);
  EXPECT_TRUE(logits.isfinite().all().item<bool>());
  EXPECT_THROW(model->forward(random_tokens(config, 1, config.max_seq_len + 1)), c10::Error);
}

TEST(Llama, IsCausal) {
  const auto config = LlamaConfig::preset("tiny");
  torch::manual_seed(0);
  Llama model(config);
  torch::NoGradGuard no_grad;
  const std::int64_t t = 7;
  const torch::Tensor tokens = random_tokens(config, 2, 16);
  torch::Tensor changed = tokens.clone();
  changed.select(1, t + 1).add_(1).remainder_(config.vocab_size);
  const torch::Tensor before = model->forward(tokens);
  const torch::Tensor after = model->forward(changed);
  EXPECT_LE(max_difference(before.narrow(1, 0, t + 1), after.narrow(1, 0, t + 1)), 1e-6);
  EXPECT_GT(max_difference(before.narrow(1, t + 1, 16 - t - 1), after.narrow(1, t + 1, 16 - t - 1)), 1e-3);
}

TEST(Llama, GroupedQueryAttentionIsMultiHeadWithRepeatedKeyValueHeads) {
  auto gqa_config = LlamaConfig::preset("tiny");
  gqa_config.fused_qkv = false;  // the key/value heads' weights by name
  ASSERT_LT(gqa_config.n_kv_heads, gqa_config.n_heads);
  auto mha_config = gqa_config;
  mha_config.n_kv_heads = mha_config.n_heads;
  torch::manual_seed(0);
  Llama gqa(gqa_config);
  Llama mha(mha_config);

  // Key/value head j of the GQA model becomes heads [j * group, (j + 1) * group) of the MHA model.
  const std::int64_t group = gqa_config.n_heads / gqa_config.n_kv_heads;
  const std::int64_t head_dim = gqa_config.head_dim();
  const auto source = gqa->named_parameters();
  {
    torch::NoGradGuard no_grad;
    for (auto& item : mha->named_parameters()) {
      torch::Tensor weight = source[item.key()];
      const std::string& name = item.key();
      if (name.find("attention.wk") != std::string::npos || name.find("attention.wv") != std::string::npos) {
        weight = weight.view({gqa_config.n_kv_heads, head_dim, gqa_config.dim})
                     .repeat_interleave(group, 0)
                     .reshape({gqa_config.n_heads * head_dim, gqa_config.dim});
      }
      item.value().copy_(weight);
    }
  }
  torch::NoGradGuard no_grad;
  const torch::Tensor tokens = random_tokens(gqa_config, 2, 24);
  EXPECT_LE(max_difference(gqa->forward(tokens), mha->forward(tokens)), 1e-5);
}

// Loss and gradients of one backward, with or without activation checkpointing.
std::pair<double, std::vector<torch::Tensor>> loss_and_gradients(Llama& model, const torch::Tensor& tokens,
                                                                 bool checkpointing,
                                                                 const ddp::PrecisionPolicy& policy) {
  model->config.activation_checkpointing = checkpointing;
  model->zero_grad();
  torch::Tensor loss;
  {
    ddp::PrecisionGuard guard(policy, tokens.device());
    loss = next_token_loss(model, tokens);
  }
  EXPECT_EQ(graph_has_node(loss, "CheckpointedBlock"), checkpointing);
  loss.backward();
  std::vector<torch::Tensor> gradients;
  for (const auto& p : model->parameters()) gradients.push_back(p.grad().clone());
  return {loss.item<double>(), gradients};
}

// `actual`'s loss and every gradient within `tolerance` of `expected`'s, whose
// gradients are all non-zero (so that no parameter escapes the comparison).
void expect_same_loss_and_gradients(const std::pair<double, std::vector<torch::Tensor>>& expected,
                                    const std::pair<double, std::vector<torch::Tensor>>& actual,
                                    const std::vector<std::string>& names, double tolerance) {
  EXPECT_LE(std::abs(actual.first - expected.first), tolerance);
  ASSERT_EQ(actual.second.size(), expected.second.size());
  for (std::size_t i = 0; i < actual.second.size(); ++i) {
    EXPECT_GT(expected.second[i].abs().max().item<double>(), 0.0) << names[i];
    EXPECT_LE(max_difference(actual.second[i], expected.second[i]), tolerance) << names[i];
  }
}

void expect_checkpointing_is_exact(const ddp::PrecisionPolicy& policy) {
  const auto config = LlamaConfig::preset("tiny");
  torch::manual_seed(0);
  Llama model(config);
  const torch::Tensor tokens = random_tokens(config, 2, 33);
  const auto plain = loss_and_gradients(model, tokens, /*checkpointing=*/false, policy);
  const auto checkpointed = loss_and_gradients(model, tokens, /*checkpointing=*/true, policy);
  expect_same_loss_and_gradients(plain, checkpointed, model->named_parameters().keys(), 1e-6);
}

// SDPA's grouped key/value heads (LibTorch 2.5 and newer) compute what the
// repeated heads do, forward and backward (with older LibTorch both repeat).
TEST(Llama, GroupedKeyValueHeadsGiveTheLossAndGradientsOfRepeatedOnes) {
  auto config = LlamaConfig::preset("tiny");
  ASSERT_LT(config.n_kv_heads, config.n_heads);
  torch::manual_seed(0);
  Llama grouped(config);
  config.repeat_kv_heads = true;
  Llama repeated(config);
  {
    torch::NoGradGuard no_grad;
    const auto source = grouped->named_parameters();
    for (auto& item : repeated->named_parameters()) item.value().copy_(source[item.key()]);
  }
  const torch::Tensor tokens = random_tokens(config, 2, 33);
  // The key/value gradients are summed over each group in another order.
  expect_same_loss_and_gradients(loss_and_gradients(grouped, tokens, /*checkpointing=*/false, ddp::Precision::kFp32),
                                 loss_and_gradients(repeated, tokens, /*checkpointing=*/false, ddp::Precision::kFp32),
                                 grouped->named_parameters().keys(), 1e-5);
}

// One q/k/v projection computes what Meta's three do, forward and backward,
// when its weight is theirs stacked: its gradient is theirs stacked too.
TEST(Llama, OneQkvProjectionIsThreeStacked) {
  auto config = LlamaConfig::preset("tiny");
  config.fused_qkv = false;
  torch::manual_seed(0);
  Llama three(config);
  config.fused_qkv = true;
  Llama one(config);
  const auto source = three->named_parameters();
  const auto stacked = [&](const std::string& prefix) {
    return torch::cat({source[prefix + "wq.weight"], source[prefix + "wk.weight"], source[prefix + "wv.weight"]});
  };
  {
    torch::NoGradGuard no_grad;
    for (auto& item : one->named_parameters()) {
      const std::string& name = item.key();
      const auto at = name.find("wqkv.weight");
      item.value().copy_(at == std::string::npos ? source[name] : stacked(name.substr(0, at)));
    }
  }
  const torch::Tensor tokens = random_tokens(config, 2, 33);
  const auto [one_loss, one_grads] = loss_and_gradients(one, tokens, /*checkpointing=*/false, ddp::Precision::kFp32);
  const auto [three_loss, three_grads] =
      loss_and_gradients(three, tokens, /*checkpointing=*/false, ddp::Precision::kFp32);
  EXPECT_NEAR(one_loss, three_loss, 1e-6);
  const auto three_names = three->named_parameters().keys();
  std::map<std::string, torch::Tensor> three_by_name;
  for (std::size_t i = 0; i < three_names.size(); ++i) three_by_name[three_names[i]] = three_grads[i];
  const auto one_names = one->named_parameters().keys();
  for (std::size_t i = 0; i < one_names.size(); ++i) {
    const std::string& name = one_names[i];
    const auto at = name.find("wqkv.weight");
    const std::string prefix = name.substr(0, at);
    const torch::Tensor expected =
        at == std::string::npos
            ? three_by_name.at(name)
            : torch::cat({three_by_name.at(prefix + "wq.weight"), three_by_name.at(prefix + "wk.weight"),
                          three_by_name.at(prefix + "wv.weight")});
    EXPECT_LE(max_difference(one_grads[i], expected), 1e-5) << name;
  }
}

TEST(Llama, ActivationCheckpointingGivesTheSameGradients) { expect_checkpointing_is_exact(ddp::Precision::kFp32); }

// Backward runs outside the autocast region; the recomputation must still run
// under the forward's autocast.
TEST(Llama, ActivationCheckpointingGivesTheSameGradientsUnderAutocast) {
  expect_checkpointing_is_exact(ddp::Precision::kBf16);
}

TEST(Llama, LearnsARepeatedSequence) {
  const auto config = LlamaConfig::preset("tiny");
  torch::manual_seed(0);
  Llama model(config);
  const torch::Tensor pattern = random_tokens(config, 1, 8);
  const torch::Tensor tokens = pattern.repeat({4, 5}).narrow(1, 0, 33);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(3e-3));
  const double uniform = std::log(static_cast<double>(config.vocab_size));
  double loss = 0;
  for (int step = 0; step < 30; ++step) {
    optimizer.zero_grad();
    const torch::Tensor step_loss = next_token_loss(model, tokens);
    step_loss.backward();
    optimizer.step();
    loss = step_loss.item<double>();
  }
  EXPECT_LT(loss, 0.2 * uniform);
}

}  // namespace
