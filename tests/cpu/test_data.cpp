// The examples' data: token files and image shards round-trip, the tools make
// what the readers read, the loaders shard by rank, resume exactly and shut
// down cleanly, and bad files are refused by name.

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "images.h"
#include "tokens.h"
#include "support/remove_tree.h"
#ifdef DATA_TEST_CONVERT_IMAGEFOLDER
#include "jpeg_io.h"
#endif

namespace {

namespace fs = std::filesystem;

class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "ddp_data_test.XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << "mkdtemp " << pattern;
    dir_ = pattern;
  }
  void TearDown() override { ddp::testing::remove_tree(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

struct ToolRun {
  int status;
  std::string output;
};

// Runs a shell command, stdout and stderr together.
ToolRun run(const std::string& command) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed: " + command};
  std::string output;
  std::array<char, 4096> buffer;
  for (std::size_t n; (n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) output.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

std::string file_bytes(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream file(path, std::ios::binary);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(file.good()) << "writing " << path;
}

// Runs `action`, expecting a DataError whose message holds every one of `parts`.
template <typename Action>
void expect_data_error(Action action, const std::vector<std::string>& parts) {
  try {
    action();
    ADD_FAILURE() << "expected a DataError";
  } catch (const data::DataError& error) {
    for (const std::string& part : parts) EXPECT_NE(std::string(error.what()).find(part), std::string::npos) << error.what();
  }
}

std::vector<std::int64_t> to_vector(const at::Tensor& tensor) {
  const at::Tensor values = tensor.contiguous().to(at::kLong);
  return {values.data_ptr<std::int64_t>(), values.data_ptr<std::int64_t>() + values.numel()};
}

// ---------------------------------------------------------------- token files

class TokenFile : public DataTest, public ::testing::WithParamInterface<data::TokenType> {};

TEST_P(TokenFile, RoundTripsInLlmcLayout) {
  const data::TokenType type = GetParam();
  const std::int64_t largest = type == data::TokenType::kUInt16 ? 65535 : 4000000000ll;
  const at::Tensor tokens = at::tensor(std::vector<std::int64_t>{0, 1, 255, 256, 65535, largest, 7});
  data::write_token_file(path("t.bin"), tokens, type);

  // The layout itself, read without the library.
  const std::string bytes = file_bytes(path("t.bin"));
  const std::int64_t width = type == data::TokenType::kUInt16 ? 2 : 4;
  ASSERT_EQ(static_cast<std::int64_t>(bytes.size()), 1024 + 7 * width);
  std::int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof header);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], type == data::TokenType::kUInt16 ? 1 : 2);
  EXPECT_EQ(header[2], 7);

  const data::TokenDataset dataset(path("t.bin"));
  EXPECT_TRUE(dataset.has_header());
  EXPECT_EQ(dataset.type(), type);
  EXPECT_EQ(dataset.size(), 7);
  EXPECT_EQ(to_vector(dataset.read(0, 7)), to_vector(tokens));
  EXPECT_EQ(to_vector(dataset.read(4, 2)), (std::vector<std::int64_t>{65535, largest}));
}

INSTANTIATE_TEST_SUITE_P(Types, TokenFile, ::testing::Values(data::TokenType::kUInt16, data::TokenType::kUInt32));

TEST_F(DataTest, ReadsHeaderlessNanoGptFiles) {
  const std::vector<std::uint16_t> tokens = {3, 1, 4, 1, 5, 65535};
  write_bytes(path("nanogpt.bin"), std::string(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2));
  const data::TokenDataset dataset(path("nanogpt.bin"));
  EXPECT_FALSE(dataset.has_header());
  EXPECT_EQ(dataset.type(), data::TokenType::kUInt16);
  EXPECT_EQ(to_vector(dataset.read(0, 6)), (std::vector<std::int64_t>{3, 1, 4, 1, 5, 65535}));
}

TEST_F(DataTest, TokenWriterRefusesTokensThatDoNotFit) {
  expect_data_error([&] { data::write_token_file(path("t.bin"), at::tensor(std::vector<std::int64_t>{65536}),
                                                 data::TokenType::kUInt16); },
                    {path("t.bin"), "uint16"});
  EXPECT_FALSE(fs::exists(path("t.bin")));
  EXPECT_FALSE(fs::exists(path("t.bin.tmp")));
}

TEST_F(DataTest, BadTokenFilesAreRefusedByName) {
  expect_data_error([&] { data::TokenDataset(path("missing.bin")); }, {"open", path("missing.bin")});

  write_bytes(path("empty.bin"), "");
  expect_data_error([&] { data::TokenDataset(path("empty.bin")); }, {path("empty.bin"), "no tokens"});

  write_bytes(path("odd.bin"), "abc");
  expect_data_error([&] { data::TokenDataset(path("odd.bin")); }, {path("odd.bin"), "odd size"});

  write_bytes(path("book.txt"), "It was a bright cold day in April,\nand the clocks were striking thirteen.\n");
  expect_data_error([&] { data::TokenDataset(path("book.txt")); },
                    {path("book.txt"), "looks like text, not tokens", "make_tokens"});

  data::write_token_file(path("good.bin"), at::arange(10, at::kLong), data::TokenType::kUInt16);
  std::string bytes = file_bytes(path("good.bin"));
  write_bytes(path("short.bin"), bytes.substr(0, bytes.size() - 2));
  expect_data_error([&] { data::TokenDataset(path("short.bin")); }, {path("short.bin"), "corrupt", "counts 10 tokens"});

  bytes[4] = 9;  // version
  write_bytes(path("version.bin"), bytes);
  expect_data_error([&] { data::TokenDataset(path("version.bin")); }, {path("version.bin"), "version 9"});
}

// ------------------------------------------------------------------ make_tokens

TEST_F(DataTest, MakeTokensRoundTripsTextBytes) {
  std::string text;
  for (int i = 0; i < 50; ++i) text += "line " + std::to_string(i) + ": caf\xc3\xa9 \t\x01\xff\n";
  write_bytes(path("a.txt"), text.substr(0, 300));
  write_bytes(path("b.txt"), text.substr(300));
  const ToolRun result = run(std::string(DATA_TEST_MAKE_TOKENS) + " --input " + path("a.txt") + "," + path("b.txt") +
                         " --output " + path("train.bin") + " --val-fraction 0.25 --val-output " + path("val.bin"));
  ASSERT_EQ(result.status, 0) << result.output;

  const data::TokenDataset train(path("train.bin"));
  const data::TokenDataset val(path("val.bin"));
  EXPECT_EQ(train.type(), data::TokenType::kUInt16);
  EXPECT_EQ(val.size(), static_cast<std::int64_t>(text.size() / 4));
  std::string decoded;
  for (const data::TokenDataset* part : {&train, &val}) {
    for (std::int64_t token : to_vector(part->read(0, part->size()))) decoded += static_cast<char>(token);
  }
  EXPECT_EQ(decoded, text);
}

TEST_F(DataTest, MakeTokensErrors) {
  const std::string tool = DATA_TEST_MAKE_TOKENS;
  write_bytes(path("empty.txt"), "");

  ToolRun result = run(tool + " --output " + path("t.bin"));
  EXPECT_EQ(result.status, 2) << result.output;
  EXPECT_NE(result.output.find("--input is required"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("usage:"), std::string::npos) << result.output;

  result = run(tool + " --input x --output y --bogus 1");
  EXPECT_EQ(result.status, 2) << result.output;
  EXPECT_NE(result.output.find("--bogus"), std::string::npos) << result.output;

  result = run(tool + " --input x --output y --val-fraction 0.5");
  EXPECT_EQ(result.status, 2) << result.output;
  EXPECT_NE(result.output.find("--val-output"), std::string::npos) << result.output;

  result = run(tool + " --input " + path("missing.txt") + " --output " + path("t.bin"));
  EXPECT_EQ(result.status, 1) << result.output;
  EXPECT_NE(result.output.find(path("missing.txt")), std::string::npos) << result.output;

  result = run(tool + " --input " + path("empty.txt") + " --output " + path("t.bin"));
  EXPECT_EQ(result.status, 1) << result.output;
  EXPECT_NE(result.output.find("no text"), std::string::npos) << result.output;
  EXPECT_FALSE(fs::exists(path("t.bin")));
}

// ---------------------------------------------------------------- token batches

class TokenBatchesTest : public DataTest {
 protected:
  // Token i is i, so a row's first token says which window it is.
  void SetUp() override {
    DataTest::SetUp();
    data::write_token_file(path("seq.bin"), at::arange(kTokens, at::kLong), data::TokenType::kUInt32);
  }
  data::TokenBatchOptions options(std::int64_t rank, std::int64_t world, std::uint64_t seed = 5) const {
    data::TokenBatchOptions o;
    o.batch_size = 3;
    o.seq_len = 8;
    o.rank = rank;
    o.world_size = world;
    o.seed = seed;
    return o;
  }
  static constexpr std::int64_t kTokens = 8 * 40 + 5;  // 40 windows
};

TEST_F(TokenBatchesTest, RanksTakeDisjointWholeWindows) {
  data::TokenBatches rank0(path("seq.bin"), options(0, 2));
  data::TokenBatches rank1(path("seq.bin"), options(1, 2));
  ASSERT_EQ(rank0.batches_per_epoch(), 40 / 6);
  std::set<std::int64_t> starts;
  for (std::int64_t step = 0; step < rank0.batches_per_epoch(); ++step) {
    for (data::TokenBatches* ranks : {&rank0, &rank1}) {
      const data::TokenBatch batch = ranks->next();
      ASSERT_EQ(batch.tokens.sizes(), (at::IntArrayRef{3, 9}));
      EXPECT_TRUE(at::equal(batch.inputs().narrow(1, 1, 7), batch.targets().narrow(1, 0, 7)));
      for (std::int64_t row = 0; row < 3; ++row) {
        const std::vector<std::int64_t> tokens = to_vector(batch.tokens[row]);
        EXPECT_EQ(tokens[0] % 8, 0) << "windows start every T tokens";
        for (std::size_t i = 1; i < tokens.size(); ++i) EXPECT_EQ(tokens[i], tokens[0] + static_cast<std::int64_t>(i));
        EXPECT_TRUE(starts.insert(tokens[0]).second) << "window at " << tokens[0] << " drawn twice in an epoch";
      }
    }
  }
  EXPECT_EQ(starts.size(), 36u);
}

TEST_F(TokenBatchesTest, OrderIsDeterministicFromTheSeed) {
  data::TokenBatches a(path("seq.bin"), options(0, 1));
  data::TokenBatches b(path("seq.bin"), options(0, 1));
  data::TokenBatches other_seed(path("seq.bin"), options(0, 1, 6));
  bool differs = false;
  for (int i = 0; i < 20; ++i) {
    const at::Tensor expected = a.next().tokens;
    EXPECT_TRUE(at::equal(expected, b.next().tokens)) << "batch " << i;
    differs = differs || !at::equal(expected, other_seed.next().tokens);
  }
  EXPECT_TRUE(differs);
}

TEST_F(TokenBatchesTest, SeekToPositionResumesExactly) {
  data::TokenBatches first(path("seq.bin"), options(1, 2));
  for (int i = 0; i < 5; ++i) first.next();
  const std::int64_t saved = first.position();
  EXPECT_EQ(saved, 5);
  std::vector<at::Tensor> expected;
  for (int i = 0; i < 9; ++i) expected.push_back(first.next().tokens);  // crosses into epoch 2

  data::TokenBatches resumed(path("seq.bin"), options(1, 2));
  resumed.seek(saved);
  for (std::size_t i = 0; i < expected.size(); ++i) EXPECT_TRUE(at::equal(resumed.next().tokens, expected[i])) << i;
}

TEST_F(TokenBatchesTest, UnshuffledReadsWindowsInFileOrder) {
  data::TokenBatchOptions o = options(1, 2);
  o.shuffle = false;
  data::TokenBatches batches(path("seq.bin"), o);
  EXPECT_EQ(to_vector(batches.next().tokens.select(1, 0)), (std::vector<std::int64_t>{24, 32, 40}));
  EXPECT_EQ(to_vector(batches.next().tokens.select(1, 0)), (std::vector<std::int64_t>{72, 80, 88}));
}

// Checked when the file is opened, over the whole file: the bad token is the
// last one, which no early batch would read.
TEST_F(TokenBatchesTest, TokensOutsideTheVocabularyAreNamedWhenTheFileOpens) {
  data::TokenBatchOptions o = options(0, 1);
  o.vocab_size = kTokens - 1;
  expect_data_error(
      [&] { data::TokenBatches(path("seq.bin"), o); },
      {path("seq.bin"), "token " + std::to_string(kTokens - 1) + " at position " + std::to_string(kTokens - 1) +
                            " is outside the model's vocabulary of " + std::to_string(kTokens - 1)});
  o.vocab_size = kTokens;
  data::TokenBatches batches(path("seq.bin"), o);  // every token fits
}

TEST_F(TokenBatchesTest, TooSmallAFileIsNamed) {
  data::TokenBatchOptions o = options(0, 16);
  expect_data_error([&] { data::TokenBatches(path("seq.bin"), o); }, {path("seq.bin"), "too few"});
}

TEST(SyntheticTokens, DeterministicPerRankAndStepAndLearnable) {
  data::TokenBatchOptions o;
  o.batch_size = 4;
  o.seq_len = 16;
  o.vocab_size = 50;
  o.world_size = 2;
  data::SyntheticTokens rank0(o), again(o);
  o.rank = 1;
  data::SyntheticTokens rank1(o);
  std::vector<at::Tensor> drawn;
  std::map<std::int64_t, std::int64_t> successor;
  for (int step = 0; step < 6; ++step) {
    const at::Tensor tokens = rank0.next().tokens;
    EXPECT_TRUE(at::equal(tokens, again.next().tokens));
    EXPECT_FALSE(at::equal(tokens, rank1.next().tokens));
    EXPECT_GE(tokens.min().item<std::int64_t>(), 0);
    EXPECT_LT(tokens.max().item<std::int64_t>(), 50);
    drawn.push_back(tokens);
    // Each token always follows the same way: a model can learn it.
    for (std::int64_t row = 0; row < 4; ++row) {
      const std::vector<std::int64_t> line = to_vector(tokens[row]);
      for (std::size_t i = 1; i < line.size(); ++i) {
        EXPECT_EQ(successor.emplace(line[i - 1], line[i]).first->second, line[i]);
      }
    }
  }
  again.seek(3);
  EXPECT_TRUE(at::equal(again.next().tokens, drawn[3]));
  EXPECT_EQ(again.position(), 4);
}

// ---------------------------------------------------------------- image shards

// Image i is filled with the value i (so crops and flips keep its identity)
// and labelled i % 3.
void write_constant_images(const std::string& directory, const std::string& split, std::int64_t count,
                           std::int64_t height, std::int64_t width, std::int64_t per_shard) {
  data::write_class_names(directory, {"ant", "bee", "cat"});
  data::ImageShardWriter writer(directory, split, height, width, per_shard);
  for (std::int64_t i = 0; i < count; ++i) {
    const std::vector<std::uint8_t> pixels(height * width * 3, static_cast<std::uint8_t>(i));
    writer.add(pixels.data(), static_cast<std::int32_t>(i % 3));
  }
  writer.finish();
}

TEST_F(DataTest, ImageShardsRoundTrip) {
  data::write_class_names(dir_.string(), {"ant", "bee", "cat"});
  data::ImageShardWriter writer(dir_.string(), "train", 4, 5, 3);
  std::vector<std::vector<std::uint8_t>> images;
  for (int i = 0; i < 7; ++i) {
    std::vector<std::uint8_t> pixels(4 * 5 * 3);
    for (std::size_t p = 0; p < pixels.size(); ++p) pixels[p] = static_cast<std::uint8_t>(i * 31 + p);
    writer.add(pixels.data(), i % 3);
    images.push_back(pixels);
  }
  EXPECT_EQ(writer.finish(), 3);
  EXPECT_TRUE(fs::exists(data::shard_path(dir_.string(), "train", 2)));
  EXPECT_EQ(fs::file_size(data::shard_path(dir_.string(), "train", 2)), 32u + 1 * (4 + 60));

  const data::ImageShardDataset dataset(dir_.string(), "train");
  EXPECT_EQ(dataset.size(), 7);
  EXPECT_EQ(dataset.height(), 4);
  EXPECT_EQ(dataset.width(), 5);
  EXPECT_EQ(dataset.class_names(), (std::vector<std::string>{"ant", "bee", "cat"}));
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(dataset.label(i), i % 3);
    EXPECT_EQ(std::vector<std::uint8_t>(dataset.pixels(i), dataset.pixels(i) + 60), images[i]) << "image " << i;
  }
}

TEST_F(DataTest, BadImageShardsAreRefusedByName) {
  expect_data_error([&] { data::ImageShardDataset(path("nowhere"), "train"); }, {path("nowhere"), "no such"});

  write_constant_images(dir_.string(), "train", 4, 2, 2, 2);
  expect_data_error([&] { data::ImageShardDataset(dir_.string(), "val"); }, {dir_.string(), "no val-*.shard"});

  const std::string shard = data::shard_path(dir_.string(), "train", 1);
  const std::string good = file_bytes(shard);
  write_bytes(shard, "JUNKJUNK" + good.substr(8));
  expect_data_error([&] { data::ImageShardDataset(dir_.string(), "train"); }, {shard, "wrong magic"});

  write_bytes(shard, good.substr(0, good.size() - 1));
  expect_data_error([&] { data::ImageShardDataset(dir_.string(), "train"); }, {shard, "corrupt", "2 images of 2x2"});

  write_bytes(shard, good.substr(0, 20));
  expect_data_error([&] { data::ImageShardDataset(dir_.string(), "train"); }, {shard, "truncated"});

  std::string bad_label = good;
  bad_label[32] = 7;
  write_bytes(shard, bad_label);
  expect_data_error([&] { data::ImageShardDataset(dir_.string(), "train"); }, {shard, "label 7", "classes.txt"});

  write_bytes(shard, good);
  fs::remove(path("classes.txt"));
  expect_data_error([&] { data::ImageShardDataset(dir_.string(), "train"); }, {path("classes.txt")});
}

// ---------------------------------------------------------------- image loader

// Back to 0..255 pixel values, NHWC.
at::Tensor denormalize(const at::Tensor& images) {
  const at::Tensor mean = at::tensor(std::vector<float>{0.485f, 0.456f, 0.406f}).view({1, 3, 1, 1});
  const at::Tensor std = at::tensor(std::vector<float>{0.229f, 0.224f, 0.225f}).view({1, 3, 1, 1});
  return ((images * std + mean) * 255).round().permute({0, 2, 3, 1});
}

data::ImageLoaderOptions loader_options(std::int64_t rank, std::int64_t world, bool train) {
  data::ImageLoaderOptions o;
  o.batch_size = 3;
  o.rank = rank;
  o.world_size = world;
  o.seed = 11;
  o.train = train;
  o.workers = 2;
  o.prefetch = 2;
  return o;
}

// Every image of an epoch once over both ranks, each batch's pixels the
// images its indices name.
void expect_epoch_covers(const std::shared_ptr<const data::ImageShardDataset>& dataset, bool train) {
  std::multiset<std::int64_t> seen;
  for (std::int64_t rank = 0; rank < 2; ++rank) {
    data::ImageLoader loader(dataset, loader_options(rank, 2, train));
    for (std::int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
      const data::ImageBatch batch = loader.next();
      const std::int64_t n = batch.indices.size(0);
      ASSERT_EQ(batch.images.sizes(), (at::IntArrayRef{n, 3, dataset->height(), dataset->width()}));
      EXPECT_EQ(batch.images.scalar_type(), at::kFloat);
      EXPECT_TRUE(batch.images.is_contiguous(at::MemoryFormat::ChannelsLast));
      const at::Tensor pixels = denormalize(batch.images);
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t index = batch.indices[i].item<std::int64_t>();
        seen.insert(index);
        EXPECT_EQ(batch.labels[i].item<std::int64_t>(), index % 3);
        EXPECT_TRUE(at::all(pixels[i] == static_cast<double>(index)).item<bool>()) << "image " << index;
      }
    }
    EXPECT_EQ(loader.position().epoch, 1);
    EXPECT_EQ(loader.position().batch, 0);
  }
  EXPECT_EQ(static_cast<std::int64_t>(seen.size()), dataset->size());
  EXPECT_EQ(static_cast<std::int64_t>(std::set<std::int64_t>(seen.begin(), seen.end()).size()), dataset->size());
}

TEST_F(DataTest, LoaderTrainEpochTakesEveryImageOnceAcrossRanks) {
  write_constant_images(dir_.string(), "train", 24, 6, 6, 5);
  expect_epoch_covers(std::make_shared<const data::ImageShardDataset>(dir_.string(), "train"), /*train=*/true);
}

TEST_F(DataTest, LoaderValidationTakesEveryImageOnceWithUnevenRanks) {
  write_constant_images(dir_.string(), "val", 23, 6, 6, 5);
  expect_epoch_covers(std::make_shared<const data::ImageShardDataset>(dir_.string(), "val"), /*train=*/false);
}

// 31 images, 2 ranks, steps of 2 batches of 3: two whole steps (24 images),
// then 7 left: one more step of 6 for rank 0 alone; one image dropped.
TEST_F(DataTest, LoaderDealsAnEpochsLeftoverAsOneMoreStepToSomeRanks) {
  write_constant_images(dir_.string(), "train", 31, 4, 4, 8);
  const auto dataset = std::make_shared<const data::ImageShardDataset>(dir_.string(), "train");
  std::multiset<std::int64_t> seen;
  for (std::int64_t rank = 0; rank < 2; ++rank) {
    data::ImageLoaderOptions options = loader_options(rank, 2, true);
    options.batches_per_step = 2;
    options.uneven_tail = true;
    data::ImageLoader loader(dataset, options);
    ASSERT_EQ(loader.batches_per_epoch(), 6);
    for (std::int64_t step = 0; step < 3; ++step) {
      EXPECT_EQ(loader.uneven_step_next(), step == 2) << "step " << step;
      EXPECT_EQ(loader.has_step_here(), step < 2 || rank == 0) << "rank " << rank << " step " << step;
      if (!loader.has_step_here()) {
        loader.skip_step();
        continue;
      }
      for (std::int64_t batch = 0; batch < 2; ++batch) {
        const data::ImageBatch drawn = loader.next();
        ASSERT_EQ(drawn.indices.size(0), 3);
        for (std::int64_t index : to_vector(drawn.indices)) seen.insert(index);
      }
    }
    EXPECT_EQ(loader.position().epoch, 1);
    EXPECT_EQ(loader.position().batch, 0);
    EXPECT_FALSE(loader.uneven_step_next());
  }
  EXPECT_EQ(seen.size(), 30u);
  EXPECT_EQ(std::set<std::int64_t>(seen.begin(), seen.end()).size(), 30u);  // none twice
}

TEST_F(DataTest, LoaderShufflesEachEpochDifferently) {
  write_constant_images(dir_.string(), "train", 24, 2, 2, 24);
  data::ImageLoader loader(std::make_shared<const data::ImageShardDataset>(dir_.string(), "train"),
                           loader_options(0, 1, true));
  std::vector<std::int64_t> epochs[2];
  for (auto& order : epochs) {
    for (std::int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
      for (std::int64_t index : to_vector(loader.next().indices)) order.push_back(index);
    }
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_EQ(std::set<std::int64_t>(epochs[1].begin(), epochs[1].end()).size(), 24u);
}

// Writing a smaller dataset over a larger one leaves none of its shards
// behind (the reader would have taken them as part of the new one).
TEST_F(DataTest, AShardWriterRemovesTheShardsOfAnEarlierLargerDataset) {
  write_constant_images(dir_.string(), "train", 5, 2, 2, /*per_shard=*/1);
  write_constant_images(dir_.string(), "train", 2, 2, 2, /*per_shard=*/1);
  EXPECT_EQ(data::ImageShardDataset(dir_.string(), "train").size(), 2);
  EXPECT_FALSE(fs::exists(data::shard_path(dir_.string(), "train", 2)));
}

TEST_F(DataTest, LoaderCropsAndFlipsInTrainingAndCentersInValidation) {
  // Pixel (y, x) holds x in red and y in green.
  data::write_class_names(dir_.string(), {"only"});
  data::ImageShardWriter writer(dir_.string(), "train", 8, 8, 64);
  std::vector<std::uint8_t> pixels(8 * 8 * 3);
  for (int y = 0; y < 8; ++y) {
    for (int x = 0; x < 8; ++x) {
      pixels[(y * 8 + x) * 3] = static_cast<std::uint8_t>(x);
      pixels[(y * 8 + x) * 3 + 1] = static_cast<std::uint8_t>(y);
    }
  }
  for (int i = 0; i < 32; ++i) writer.add(pixels.data(), 0);
  writer.finish();
  auto dataset = std::make_shared<const data::ImageShardDataset>(dir_.string(), "train");

  std::set<std::pair<std::int64_t, std::int64_t>> corners;
  std::set<bool> flips;
  data::ImageLoaderOptions o = loader_options(0, 1, true);
  o.crop_size = 4;
  o.batch_size = 32;
  data::ImageLoader train(dataset, o);
  const at::Tensor out = denormalize(train.next().images);
  for (std::int64_t i = 0; i < 32; ++i) {
    const std::vector<std::int64_t> xs = to_vector(out[i].select(2, 0)[0]);
    const std::vector<std::int64_t> ys = to_vector(out[i].select(2, 1).select(1, 0));
    const bool flipped = xs[0] > xs[3];
    flips.insert(flipped);
    const std::int64_t left = flipped ? xs[3] : xs[0];
    for (std::int64_t k = 0; k < 4; ++k) {
      EXPECT_EQ(xs[k], flipped ? left + 3 - k : left + k) << "image " << i;
      EXPECT_EQ(ys[k], ys[0] + k) << "image " << i;
    }
    corners.insert({ys[0], left});
  }
  EXPECT_EQ(flips.size(), 2u) << "32 images, none flipped or all flipped";
  EXPECT_GT(corners.size(), 4u) << "random crops hardly vary";

  o.train = false;
  data::ImageLoader val(dataset, o);
  const at::Tensor center = denormalize(val.next().images);
  EXPECT_EQ(to_vector(center[0].select(2, 0)[0]), (std::vector<std::int64_t>{2, 3, 4, 5}));
  EXPECT_EQ(to_vector(center[0].select(2, 1).select(1, 0)), (std::vector<std::int64_t>{2, 3, 4, 5}));
}

TEST_F(DataTest, LoaderResumesFromItsPosition) {
  write_constant_images(dir_.string(), "train", 30, 6, 6, 7);
  auto dataset = std::make_shared<const data::ImageShardDataset>(dir_.string(), "train");
  data::ImageLoaderOptions o = loader_options(1, 2, true);
  o.crop_size = 4;
  data::ImageLoader first(dataset, o);
  ASSERT_EQ(first.batches_per_epoch(), 5);
  for (int i = 0; i < 7; ++i) first.next();
  const data::ImagePosition saved = first.position();
  EXPECT_EQ(saved.epoch, 1);
  EXPECT_EQ(saved.batch, 2);
  std::vector<data::ImageBatch> expected;
  for (int i = 0; i < 6; ++i) expected.push_back(first.next());

  data::ImageLoader resumed(dataset, o);
  resumed.next();  // something prefetched, to be dropped by the seek
  resumed.seek(saved);
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const data::ImageBatch batch = resumed.next();
    EXPECT_TRUE(at::equal(batch.indices, expected[i].indices)) << i;
    EXPECT_TRUE(at::equal(batch.images, expected[i].images)) << i;
  }
  EXPECT_THROW(resumed.seek({0, 6}), std::invalid_argument);
}

TEST_F(DataTest, LoaderShutsDownMidEpoch) {
  write_constant_images(dir_.string(), "train", 60, 6, 6, 10);
  auto dataset = std::make_shared<const data::ImageShardDataset>(dir_.string(), "train");
  for (int drawn = 0; drawn < 3; ++drawn) {
    data::ImageLoader loader(dataset, loader_options(0, 1, true));
    for (int i = 0; i < drawn; ++i) loader.next();
  }  // each destructor joins workers that are blocked on a full queue or still working
  SUCCEED();
}

TEST(SyntheticImages, DeterministicPerRankAndStep) {
  data::ImageLoaderOptions o;
  o.batch_size = 4;
  o.crop_size = 32;
  o.world_size = 2;
  data::SyntheticImages rank0(o, 1000, 10), again(o, 1000, 10);
  o.rank = 1;
  data::SyntheticImages rank1(o, 1000, 10);
  std::vector<data::ImageBatch> drawn;
  bool ranks_differ = false;
  for (int step = 0; step < 12; ++step) {
    const data::ImageBatch batch = rank0.next();
    ASSERT_EQ(batch.images.sizes(), (at::IntArrayRef{4, 3, 32, 32}));
    EXPECT_TRUE(batch.images.is_contiguous(at::MemoryFormat::ChannelsLast));
    EXPECT_GE(batch.labels.min().item<std::int64_t>(), 0);
    EXPECT_LT(batch.labels.max().item<std::int64_t>(), 1000);
    EXPECT_TRUE(at::equal(batch.images, again.next().images));
    ranks_differ = ranks_differ || !at::equal(batch.indices, rank1.next().indices);
    drawn.push_back(batch);
  }
  EXPECT_TRUE(ranks_differ);
  EXPECT_EQ(rank0.position().epoch, 1);
  EXPECT_EQ(rank0.position().batch, 2);
  again.seek({0, 9});
  EXPECT_TRUE(at::equal(again.next().images, drawn[9].images));
}

// ---------------------------------------------------------------- make_images

// The classes must differ in what the loader keeps (stripe period and tint
// survive crops and flips): the mean colour of a class's images differs from
// another's by more than the spread within a class would allow.
TEST_F(DataTest, MakeImagesWritesLearnableClasses) {
  const std::string command = std::string(DATA_TEST_MAKE_IMAGES) + " --classes 3 --train 60 --val 9 --size 32";
  ToolRun result = run(command + " --output " + path("a"));
  ASSERT_EQ(result.status, 0) << result.output;
  const data::ImageShardDataset train(path("a"), "train"), val(path("a"), "val");
  EXPECT_EQ(train.size(), 60);
  EXPECT_EQ(val.size(), 9);
  EXPECT_EQ(train.height(), 32);
  ASSERT_EQ(train.class_names().size(), 3u);
  std::vector<std::array<double, 3>> mean(3, {0, 0, 0});
  std::vector<int> count(3, 0);
  for (std::int64_t i = 0; i < train.size(); ++i) {
    const std::int32_t label = train.label(i);
    ASSERT_TRUE(label >= 0 && label < 3);
    ++count[label];
    for (std::int64_t p = 0; p < 32 * 32; ++p) {
      for (int k = 0; k < 3; ++k) mean[label][k] += train.pixels(i)[p * 3 + k] / (255.0 * 32 * 32);
    }
  }
  for (int c = 0; c < 3; ++c) {
    ASSERT_GT(count[c], 5) << "class " << c;
    for (double& m : mean[c]) m /= count[c];
  }
  for (int a = 0; a < 3; ++a) {
    for (int b = a + 1; b < 3; ++b) {
      double distance = 0;
      for (int k = 0; k < 3; ++k) distance += std::abs(mean[a][k] - mean[b][k]);
      EXPECT_GT(distance, 0.1) << "classes " << a << " and " << b << " look alike";
    }
  }
  // The seed decides every byte.
  result = run(command + " --output " + path("b"));
  ASSERT_EQ(result.status, 0) << result.output;
  const data::ImageShardDataset again(path("b"), "train");
  EXPECT_EQ(std::memcmp(train.pixels(0), again.pixels(0), 32 * 32 * 3 * 60), 0);
  result = run(std::string(DATA_TEST_MAKE_IMAGES) + " --classes 1 --output " + path("c"));
  EXPECT_EQ(result.status, 2) << result.output;
  EXPECT_NE(result.output.find("--classes must be in [2, 1000]"), std::string::npos) << result.output;
}

// ---------------------------------------------------------- convert_imagefolder

#ifdef DATA_TEST_CONVERT_IMAGEFOLDER

constexpr std::uint8_t kColours[3][3] = {{220, 30, 30}, {30, 200, 40}, {40, 50, 210}};

// A tree of solid-colour JPEGs, one colour a class, of varied sizes and
// aspect ratios.
void write_image_folder(const fs::path& root) {
  const char* classes[3] = {"cat", "dog", "eel"};
  for (int c = 0; c < 3; ++c) {
    fs::create_directories(root / classes[c]);
    for (int i = 0; i < 4; ++i) {
      tools::RgbImage image;
      image.height = 24 + 8 * i;
      image.width = 56 - 8 * i;
      for (std::int64_t p = 0; p < image.height * image.width; ++p) {
        image.pixels.insert(image.pixels.end(), kColours[c], kColours[c] + 3);
      }
      tools::encode_jpeg((root / classes[c] / ("img" + std::to_string(i) + (i == 3 ? ".JPEG" : ".jpg"))).string(),
                         image, 95);
    }
  }
  std::ofstream(root / "cat" / "notes.txt") << "not an image";
}

TEST_F(DataTest, ConvertImageFolderKeepsLabelsAndSizes) {
  write_image_folder(dir_ / "tree");
  const ToolRun result = run(std::string(DATA_TEST_CONVERT_IMAGEFOLDER) + " --input " + path("tree") + " --output " +
                         path("shards") + " --size 16 --images-per-shard 4 --val-fraction 0.25 --threads 2");
  ASSERT_EQ(result.status, 0) << result.output;

  const data::ImageShardDataset train(path("shards"), "train");
  const data::ImageShardDataset val(path("shards"), "val");
  EXPECT_EQ(train.class_names(), (std::vector<std::string>{"cat", "dog", "eel"}));
  EXPECT_TRUE(fs::exists(data::shard_path(path("shards"), "train", 2)));
  ASSERT_EQ(train.size(), 9);
  ASSERT_EQ(val.size(), 3);
  for (const data::ImageShardDataset* split : {&train, &val}) {
    EXPECT_EQ(split->height(), 16);
    EXPECT_EQ(split->width(), 16);
    std::vector<int> per_class(3);
    for (std::int64_t i = 0; i < split->size(); ++i) {
      const std::int32_t label = split->label(i);
      ASSERT_GE(label, 0);
      ASSERT_LT(label, 3);
      ++per_class[label];
      // The centre pixel keeps its class's colour through JPEG and resizing.
      const std::uint8_t* centre = split->pixels(i) + (8 * 16 + 8) * 3;
      for (int c = 0; c < 3; ++c) EXPECT_NEAR(centre[c], kColours[label][c], 12) << "image " << i << " label " << label;
    }
    EXPECT_EQ(per_class, (std::vector<int>(3, static_cast<int>(split->size() / 3))));
  }
}

TEST_F(DataTest, ConvertImageFolderNamesBadInput) {
  const std::string tool = DATA_TEST_CONVERT_IMAGEFOLDER;
  ToolRun result = run(tool + " --input " + path("missing") + " --output " + path("out"));
  EXPECT_EQ(result.status, 1) << result.output;
  EXPECT_NE(result.output.find(path("missing")), std::string::npos) << result.output;

  result = run(tool + " --input " + path("x") + " --output " + path("out") + " --size 0");
  EXPECT_EQ(result.status, 2) << result.output;
  EXPECT_NE(result.output.find("usage:"), std::string::npos) << result.output;

  write_image_folder(dir_ / "tree");
  const std::string broken = (dir_ / "tree" / "dog" / "broken.jpg").string();
  std::ofstream(broken) << "\xff\xd8 this is not really a JPEG";
  const std::string convert = tool + " --input " + path("tree") + " --output " + path("out") + " --size 8";
  result = run(convert);
  EXPECT_EQ(result.status, 1) << result.output;
  EXPECT_NE(result.output.find(broken), std::string::npos) << result.output;

  result = run(convert + " --skip-bad");
  EXPECT_EQ(result.status, 0) << result.output;
  EXPECT_NE(result.output.find("skipping"), std::string::npos) << result.output;
  EXPECT_EQ(data::ImageShardDataset(path("out"), "train").size(), 12);
}

#endif

}  // namespace
