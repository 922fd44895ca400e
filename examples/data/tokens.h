#pragma once

// Token data for language-model training: flat binary token files, the
// batches a trainer draws from them, and a synthetic source with the same
// interface.
//
// Token file layout (llm.c's; all integers little-endian):
//   bytes 0 .. 1023   header, 256 x int32:
//                       [0] magic 20240520
//                       [1] version: 1 = uint16 tokens, 2 = uint32 tokens
//                       [2] token count N (so at most 2^31 - 1 tokens a file)
//                       [3 .. 255] zero
//   bytes 1024 ..     N tokens, uint16 or uint32 as the version says
// Files whose first int32 is not the magic are read as nanoGPT's layout: raw
// uint16 tokens, no header (an odd byte count is refused). A file that starts
// with the magic but whose version or count disagrees with its size is
// refused as corrupt; so a headerless file whose first two tokens happen to be
// 55432, 308 cannot be read, and must be rewritten with a header.
// docs/data_formats.md has the same description with examples.

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "io.h"

namespace data {

enum class TokenType { kUInt16, kUInt32 };

constexpr std::int32_t kTokenFileMagic = 20240520;
constexpr std::int64_t kTokenHeaderInts = 256;

/// A token file, memory-mapped read-only.
class TokenDataset {
 public:
  /// Throws DataError naming the file if it is missing, empty or malformed.
  explicit TokenDataset(const std::string& path);

  std::int64_t size() const { return size_; }
  TokenType type() const { return type_; }
  /// False for nanoGPT's headerless files.
  bool has_header() const { return has_header_; }
  const std::string& path() const { return file_.path(); }

  /// Tokens [start, start + count) widened to int64, into `out`.
  void read(std::int64_t start, std::int64_t count, std::int64_t* out) const;
  /// The same as a new int64 tensor.
  at::Tensor read(std::int64_t start, std::int64_t count) const;

 private:
  MappedFile file_;
  TokenType type_ = TokenType::kUInt16;
  bool has_header_ = false;
  const std::uint8_t* tokens_ = nullptr;
  std::int64_t size_ = 0;
};

/// The smallest token type that holds tokens 0 .. vocab_size - 1.
TokenType token_type_for_vocab(std::int64_t vocab_size);

/// Writes `tokens` (a 1-D integer tensor) in llm.c's layout, atomically.
/// Throws DataError if a token does not fit `type` or there are more than
/// 2^31 - 1 tokens (the header counts in int32).
void write_token_file(const std::string& path, const at::Tensor& tokens, TokenType type);

/// Rows of T + 1 consecutive tokens: the model reads the first T of each row
/// and predicts the last T.
struct TokenBatch {
  at::Tensor tokens;  // [B, T + 1] int64, on the CPU

  at::Tensor inputs() const { return tokens.narrow(1, 0, tokens.size(1) - 1); }
  at::Tensor targets() const { return tokens.narrow(1, 1, tokens.size(1) - 1); }
};

struct TokenBatchOptions {
  std::int64_t batch_size = 8;  // rows per batch on each rank
  std::int64_t seq_len = 256;   // T
  std::int64_t rank = 0;
  std::int64_t world_size = 1;
  std::uint64_t seed = 0;
  /// Random window order, new each epoch (training); false reads the windows
  /// in file order (validation).
  bool shuffle = true;
  /// When > 0, the whole file is checked when it is opened to hold tokens
  /// below it, so a file made for a larger vocabulary fails by name at once
  /// instead of inside the embedding.
  std::int64_t vocab_size = 0;
  /// Batches each rank draws per optimizer step (gradient accumulation).
  std::int64_t batches_per_step = 1;
  /// A file's windows rarely fill whole steps of every rank: false drops the
  /// epoch's leftover, true deals it out as one more step to as many ranks
  /// as it fills (world_size * batches_per_step batches of batch_size make
  /// a whole step; the others have no batch then: train that step under
  /// ddp::Join). Less than one rank's step is still dropped.
  bool uneven_tail = false;
};

/// What a language-model trainer draws batches from.
class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual TokenBatch next() = 0;
  /// Batches drawn so far: the same number on every rank, so a checkpoint
  /// stores one value and seek(position) on resume continues exactly there.
  virtual std::int64_t position() const = 0;
  virtual void seek(std::int64_t position) = 0;
  /// Whether the next step is an epoch's uneven tail (the same on every
  /// rank): only ranks with has_step_here() have its batches.
  virtual bool uneven_step_next() const { return false; }
  virtual bool has_step_here() const { return true; }
  /// A rank without the tail step's batches moves past them, as the others draw them.
  virtual void skip_step() {}
};

/// Batches from a token file. The file is cut into windows of T + 1 tokens
/// that start every T tokens (neighbours share one token, so every token is
/// predicted once an epoch). Each step takes world_size * batch_size windows:
/// rank r the r-th block of batch_size, so ranks never share a window within
/// an epoch. Epochs repeat forever, each in a new order drawn from
/// (seed, epoch); windows left over after the last whole step are skipped
/// that epoch, or with uneven_tail dealt out as one more step to some ranks.
class TokenBatches : public TokenSource {
 public:
  TokenBatches(const std::string& path, TokenBatchOptions options);

  TokenBatch next() override;
  std::int64_t position() const override { return position_; }
  void seek(std::int64_t position) override;

  std::int64_t batches_per_epoch() const { return batches_per_epoch_; }
  bool uneven_step_next() const override;
  bool has_step_here() const override { return !uneven_step_next() || options_.rank < tail_ranks_; }
  void skip_step() override { position_ += options_.batches_per_step; }
  const TokenDataset& dataset() const { return dataset_; }

 private:
  const std::vector<std::int64_t>& order_of(std::int64_t epoch);
  /// Throws DataError naming the first token at or above vocab_size.
  void check_vocabulary() const;

  TokenDataset dataset_;
  TokenBatchOptions options_;
  std::int64_t windows_ = 0;
  std::int64_t batches_per_epoch_ = 0;
  std::int64_t whole_batches_ = 0;  // per epoch and rank, in the steps every rank takes
  std::int64_t tail_ranks_ = 0;     // ranks with one more step at the epoch's end
  std::int64_t position_ = 0;
  std::vector<std::int64_t> order_;
  std::int64_t order_epoch_ = -1;
};

/// Synthetic tokens (the trainer's default, so it runs without files): the
/// first token of each row is random and each further token is a fixed random
/// function of the one before (a permutation of the vocabulary drawn from the
/// seed). A model can learn that, so the loss falls from ln(vocab) towards 0.
/// Rows depend only on (seed, rank, position): ranks differ, reruns repeat.
class SyntheticTokens : public TokenSource {
 public:
  /// options.vocab_size must be > 0; shuffle is ignored.
  explicit SyntheticTokens(TokenBatchOptions options);

  TokenBatch next() override;
  std::int64_t position() const override { return position_; }
  void seek(std::int64_t position) override;

 private:
  TokenBatchOptions options_;
  std::vector<std::int64_t> successor_;
  std::int64_t position_ = 0;
};

}  // namespace data
