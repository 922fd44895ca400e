#include "tokens.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "random.h"

namespace data {

// The formats are little-endian and read in place through the mapping.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files are read in place: little-endian hosts only");

namespace {

constexpr std::int64_t kHeaderBytes = kTokenHeaderInts * sizeof(std::int32_t);

std::int64_t token_bytes(TokenType type) { return type == TokenType::kUInt16 ? 2 : 4; }

std::int32_t version_of(TokenType type) { return type == TokenType::kUInt16 ? 1 : 2; }

template <typename Token>
void widen(const std::uint8_t* bytes, std::int64_t count, std::int64_t* out) {
  const auto* tokens = reinterpret_cast<const Token*>(bytes);
  std::copy(tokens, tokens + count, out);
}

template <typename Token>
void write_narrowed(AtomicFileWriter& writer, const std::int64_t* tokens, std::int64_t count) {
  // In pieces, so a file of billions of tokens needs no second copy in memory.
  constexpr std::int64_t kChunk = 1 << 20;
  std::vector<Token> chunk;
  for (std::int64_t start = 0; start < count; start += kChunk) {
    const std::int64_t n = std::min(kChunk, count - start);
    chunk.assign(tokens + start, tokens + start + n);
    writer.write(chunk.data(), chunk.size() * sizeof(Token));
  }
}

void check_options(const TokenBatchOptions& options) {
  if (options.batch_size < 1 || options.seq_len < 1) {
    throw std::invalid_argument("token batches: batch_size and seq_len must be >= 1");
  }
  if (options.batches_per_step < 1) throw std::invalid_argument("token batches: batches_per_step must be >= 1");
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    throw std::invalid_argument("token batches: rank " + std::to_string(options.rank) + " is not in [0, world_size " +
                                std::to_string(options.world_size) + ")");
  }
}

void check_position(std::int64_t position) {
  if (position < 0) throw std::invalid_argument("token batches: cannot seek to position " + std::to_string(position));
}

}  // namespace

TokenDataset::TokenDataset(const std::string& path) : file_(path) {
  const std::int64_t bytes = static_cast<std::int64_t>(file_.size());
  std::int32_t magic = 0;
  if (bytes >= static_cast<std::int64_t>(sizeof magic)) std::memcpy(&magic, file_.data(), sizeof magic);
  if (magic == kTokenFileMagic) {
    if (bytes < kHeaderBytes) {
      throw DataError(path + ": corrupt token file header: " + std::to_string(bytes) + " bytes, the header alone has " +
                      std::to_string(kHeaderBytes));
    }
    std::int32_t header[3];
    std::memcpy(header, file_.data(), sizeof header);
    if (header[1] != 1 && header[1] != 2) {
      throw DataError(path + ": corrupt token file header: version " + std::to_string(header[1]) +
                      ", expected 1 (uint16 tokens) or 2 (uint32 tokens)");
    }
    has_header_ = true;
    type_ = header[1] == 1 ? TokenType::kUInt16 : TokenType::kUInt32;
    size_ = header[2];
    const std::int64_t expected = kHeaderBytes + size_ * token_bytes(type_);
    if (size_ < 0 || expected != bytes) {
      throw DataError(path + ": corrupt token file header: it counts " + std::to_string(header[2]) +
                      " tokens, which would make " + std::to_string(expected) + " bytes, but the file has " +
                      std::to_string(bytes));
    }
    tokens_ = file_.data() + kHeaderBytes;
  } else {
    // nanoGPT's layout: raw uint16, nothing else.
    if (bytes % 2 != 0) {
      throw DataError(path + ": not a token file: no llm.c header (magic " + std::to_string(kTokenFileMagic) +
                      ") and an odd size (" + std::to_string(bytes) + " bytes) for headerless uint16 tokens");
    }
    // Text read as uint16 pairs of characters trains without complaint:
    // refuse a file whose start is printable text (real token ids almost
    // never have both bytes printable; common ones are small).
    const std::int64_t checked = std::min<std::int64_t>(bytes, 4096);
    const bool text = bytes > 0 && std::all_of(file_.data(), file_.data() + checked, [](std::uint8_t c) {
                        return (c >= 0x20 && c < 0x7f) || c == '\n' || c == '\r' || c == '\t';
                      });
    if (text) {
      throw DataError(path + ": looks like text, not tokens (no llm.c header, and its first " +
                      std::to_string(checked) + " bytes are printable characters); convert it with make_tokens");
    }
    size_ = bytes / 2;
    tokens_ = file_.data();
  }
  if (size_ == 0) throw DataError(path + ": token file holds no tokens");
}

void TokenDataset::read(std::int64_t start, std::int64_t count, std::int64_t* out) const {
  if (start < 0 || count < 0 || start + count > size_) {
    throw std::out_of_range(path() + ": tokens [" + std::to_string(start) + ", " + std::to_string(start + count) +
                            ") outside the file's " + std::to_string(size_));
  }
  const std::uint8_t* first = tokens_ + start * token_bytes(type_);
  if (type_ == TokenType::kUInt16) {
    widen<std::uint16_t>(first, count, out);
  } else {
    widen<std::uint32_t>(first, count, out);
  }
}

at::Tensor TokenDataset::read(std::int64_t start, std::int64_t count) const {
  at::Tensor out = at::empty({count}, at::kLong);
  read(start, count, out.data_ptr<std::int64_t>());
  return out;
}

TokenType token_type_for_vocab(std::int64_t vocab_size) {
  return vocab_size <= (std::int64_t{1} << 16) ? TokenType::kUInt16 : TokenType::kUInt32;
}

void write_token_file(const std::string& path, const at::Tensor& tokens, TokenType type) {
  if (tokens.dim() != 1 || !at::isIntegralType(tokens.scalar_type(), /*includeBool=*/false)) {
    throw std::invalid_argument("write_token_file " + path + ": tokens must be a 1-D integer tensor");
  }
  const at::Tensor values = tokens.to(at::kCPU, at::kLong).contiguous();
  const std::int64_t count = values.numel();
  if (count > std::numeric_limits<std::int32_t>::max()) {
    throw DataError(path + ": " + std::to_string(count) +
                    " tokens do not fit one file (its header counts in int32); split the text");
  }
  const std::int64_t limit = type == TokenType::kUInt16 ? 0xFFFF : 0xFFFFFFFFll;
  if (count > 0 && (values.min().item<std::int64_t>() < 0 || values.max().item<std::int64_t>() > limit)) {
    throw DataError(path + ": token values outside [0, " + std::to_string(limit) + "] do not fit " +
                    (type == TokenType::kUInt16 ? "uint16" : "uint32"));
  }
  std::int32_t header[kTokenHeaderInts] = {kTokenFileMagic, version_of(type), static_cast<std::int32_t>(count)};
  AtomicFileWriter writer(path);
  writer.write(header, sizeof header);
  if (type == TokenType::kUInt16) {
    write_narrowed<std::uint16_t>(writer, values.data_ptr<std::int64_t>(), count);
  } else {
    write_narrowed<std::uint32_t>(writer, values.data_ptr<std::int64_t>(), count);
  }
  writer.commit();
}

TokenBatches::TokenBatches(const std::string& path, TokenBatchOptions options)
    : dataset_(path), options_(options) {
  check_options(options_);
  windows_ = (dataset_.size() - 1) / options_.seq_len;
  const std::int64_t step_windows = options_.batch_size * options_.batches_per_step;  // one rank's step
  const std::int64_t whole_steps = windows_ / (options_.world_size * step_windows);
  whole_batches_ = whole_steps * options_.batches_per_step;
  if (options_.uneven_tail) tail_ranks_ = (windows_ - whole_steps * options_.world_size * step_windows) / step_windows;
  batches_per_epoch_ = options_.uneven_tail ? whole_batches_ + (tail_ranks_ > 0 ? options_.batches_per_step : 0)
                                            : windows_ / (options_.world_size * options_.batch_size);
  if (batches_per_epoch_ == 0) {
    throw DataError(path + ": " + std::to_string(dataset_.size()) + " tokens are too few for one step of " +
                    std::to_string(options_.world_size) + " ranks x " + std::to_string(options_.batch_size) +
                    " rows x " + std::to_string(options_.seq_len) + " + 1 tokens");
  }
  if (options_.vocab_size > 0) check_vocabulary();
}

void TokenBatches::check_vocabulary() const {
  // The whole file now, in pieces: a bad token deep in the file would
  // otherwise surface hours into a run.
  constexpr std::int64_t kPiece = std::int64_t{1} << 22;
  for (std::int64_t start = 0; start < dataset_.size(); start += kPiece) {
    const at::Tensor tokens = dataset_.read(start, std::min(kPiece, dataset_.size() - start));
    const std::int64_t largest = tokens.max().item<std::int64_t>();
    if (largest >= options_.vocab_size) {
      throw DataError(dataset_.path() + ": token " + std::to_string(largest) + " at position " +
                      std::to_string(start + tokens.argmax().item<std::int64_t>()) +
                      " is outside the model's vocabulary of " + std::to_string(options_.vocab_size) +
                      "; make the file with the model's tokenizer, or give the model a larger vocabulary");
    }
  }
}

const std::vector<std::int64_t>& TokenBatches::order_of(std::int64_t epoch) {
  if (epoch != order_epoch_) {
    if (options_.shuffle) {
      order_ = shuffled_indices(windows_, mix_seed({options_.seed, static_cast<std::uint64_t>(epoch)}));
    } else {
      order_.resize(static_cast<std::size_t>(windows_));
      std::iota(order_.begin(), order_.end(), 0);
    }
    order_epoch_ = epoch;
  }
  return order_;
}

TokenBatch TokenBatches::next() {
  const std::int64_t epoch = position_ / batches_per_epoch_;
  const std::int64_t step = position_ % batches_per_epoch_;
  const std::vector<std::int64_t>& order = order_of(epoch);
  const std::int64_t rows = options_.batch_size;
  const std::int64_t width = options_.seq_len + 1;
  // The tail step's windows follow the whole steps', rank after rank.
  const std::int64_t first = step < whole_batches_ || !options_.uneven_tail
                                 ? (step * options_.world_size + options_.rank) * rows
                                 : whole_batches_ * options_.world_size * rows +
                                       (options_.rank * options_.batches_per_step + step - whole_batches_) * rows;
  at::Tensor tokens = at::empty({rows, width}, at::kLong);
  std::int64_t* out = tokens.data_ptr<std::int64_t>();
  for (std::int64_t row = 0; row < rows; ++row) {
    dataset_.read(order[first + row] * options_.seq_len, width, out + row * width);
  }
  ++position_;
  return {tokens};
}

bool TokenBatches::uneven_step_next() const {
  return tail_ranks_ > 0 && position_ % batches_per_epoch_ == whole_batches_;
}

void TokenBatches::seek(std::int64_t position) {
  check_position(position);
  position_ = position;
}

SyntheticTokens::SyntheticTokens(TokenBatchOptions options) : options_(options) {
  check_options(options_);
  if (options_.vocab_size < 1) throw std::invalid_argument("synthetic tokens: vocab_size must be >= 1");
  successor_ = shuffled_indices(options_.vocab_size, mix_seed({options_.seed}));
}

TokenBatch SyntheticTokens::next() {
  const std::int64_t rows = options_.batch_size;
  const std::int64_t width = options_.seq_len + 1;
  SplitMix64 generator(mix_seed({options_.seed, static_cast<std::uint64_t>(options_.rank),
                                 static_cast<std::uint64_t>(position_)}));
  at::Tensor tokens = at::empty({rows, width}, at::kLong);
  std::int64_t* out = tokens.data_ptr<std::int64_t>();
  for (std::int64_t row = 0; row < rows; ++row) {
    std::int64_t* line = out + row * width;
    line[0] = static_cast<std::int64_t>(generator.below(static_cast<std::uint64_t>(options_.vocab_size)));
    for (std::int64_t i = 1; i < width; ++i) line[i] = successor_[line[i - 1]];
  }
  ++position_;
  return {tokens};
}

void SyntheticTokens::seek(std::int64_t position) {
  check_position(position);
  position_ = position;
}

}  // namespace data
