// make_tokens: text files -> a token file (llm.c layout, uint16) with a
// byte-level tokenizer: token = byte, vocabulary 256. Byte-level needs no
// vocabulary file and round-trips any text exactly, which is all the
// examples and tests need.
//
//   make_tokens --input a.txt,b.txt --output train.bin [--val-fraction 0.1 --val-output val.bin]

#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "flags.h"
#include "io.h"
#include "tokens.h"

namespace {

constexpr std::int64_t kByteVocabulary = 256;

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

void write(const std::string& path, std::vector<std::int64_t>& tokens, std::int64_t start, std::int64_t count) {
  data::write_token_file(path, at::from_blob(tokens.data() + start, {count}, at::kLong),
                         data::token_type_for_vocab(kByteVocabulary));
  std::printf("make_tokens: wrote %lld tokens to %s (uint16, vocabulary %lld)\n", static_cast<long long>(count),
              path.c_str(), static_cast<long long>(kByteVocabulary));
}

}  // namespace

int main(int argc, char** argv) {
  examples::Flags flags("make_tokens", "Turns text files into a token file (llm.c layout, byte-level tokens).");
  flags.add("input", "", "text files, comma-separated, concatenated in this order")
      .add("output", "", "token file to write")
      .add("val-fraction", "0", "fraction of the tokens, from the end, written to --val-output instead")
      .add("val-output", "", "validation token file (needed when --val-fraction > 0)");
  flags.parse(argc, argv);
  const std::vector<std::string> inputs = split_list(flags.str("input"));
  if (inputs.empty()) flags.fail("--input is required");
  if (flags.str("output").empty()) flags.fail("--output is required");
  const double val_fraction = flags.real("val-fraction");
  if (!(val_fraction >= 0 && val_fraction < 1)) flags.fail("--val-fraction must be in [0, 1)");
  if (val_fraction > 0 && flags.str("val-output").empty()) flags.fail("--val-fraction needs --val-output");
  if (val_fraction == 0 && !flags.str("val-output").empty()) flags.fail("--val-output needs --val-fraction > 0");

  try {
    std::vector<std::int64_t> tokens;
    for (const std::string& path : inputs) {
      const data::MappedFile text(path);
      tokens.insert(tokens.end(), text.data(), text.data() + text.size());
    }
    const auto total = static_cast<std::int64_t>(tokens.size());
    if (total == 0) throw data::DataError("the input files hold no text");
    const auto val_count = static_cast<std::int64_t>(static_cast<double>(total) * val_fraction);
    if (val_fraction > 0 && (val_count == 0 || val_count == total)) {
      throw data::DataError(std::to_string(total) + " bytes of text are too few to split by --val-fraction " +
                            flags.str("val-fraction"));
    }
    write(flags.str("output"), tokens, 0, total - val_count);
    if (val_count > 0) write(flags.str("val-output"), tokens, total - val_count, val_count);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "make_tokens: error: %s\n", error.what());
    return 1;
  }
  return 0;
}
