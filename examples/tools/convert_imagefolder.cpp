// convert_imagefolder: an ImageFolder tree (root/<class>/*.jpg, the layout of
// ImageNet and of torchvision's ImageFolder) -> image shards. Every image is
// decoded, its shorter side resized to --size and the central square kept;
// labels number the class directories in sorted order, as ImageFolder does.
//
//   convert_imagefolder --input imagenet/train --output shards --size 160 --val-fraction 0.01

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "flags.h"
#include "images.h"
#include "io.h"
#include "jpeg_io.h"
#include "random.h"

namespace fs = std::filesystem;

namespace {

struct Sample {
  std::string path;
  std::int32_t label;
};

struct Options {
  std::int64_t size;
  std::int64_t images_per_shard;
  std::int64_t threads;
  bool skip_bad;
};

bool is_jpeg(const fs::path& path) {
  std::string extension = path.extension().string();
  std::transform(extension.begin(), extension.end(), extension.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return extension == ".jpg" || extension == ".jpeg";
}

std::vector<fs::path> sorted_entries(const fs::path& directory, bool directories) {
  std::error_code error;
  fs::directory_iterator entries(directory, error);
  if (error) throw data::DataError("list " + directory.string() + ": " + error.message());
  std::vector<fs::path> paths;
  for (const auto& entry : entries) {
    if (directories ? entry.is_directory() : (entry.is_regular_file() && is_jpeg(entry.path()))) {
      paths.push_back(entry.path());
    }
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

// Decodes images in parallel, a shard's worth at a time, and writes them in
// order, so the shards do not depend on the number of threads.
void convert(const std::vector<Sample>& samples, const std::string& output, const std::string& split,
             const Options& options) {
  data::ImageShardWriter writer(output, split, options.size, options.size, options.images_per_shard);
  std::int64_t written = 0;
  for (std::size_t start = 0; start < samples.size(); start += options.images_per_shard) {
    const std::size_t count = std::min<std::size_t>(options.images_per_shard, samples.size() - start);
    std::vector<std::vector<std::uint8_t>> pixels(count);
    std::vector<std::string> errors(count);
    std::atomic<std::size_t> next{0};
    std::vector<std::thread> threads;
    for (std::int64_t t = 0; t < options.threads; ++t) {
      threads.emplace_back([&] {
        for (std::size_t i = next++; i < count; i = next++) {
          try {
            pixels[i] = tools::resize_center_crop(tools::decode_jpeg(samples[start + i].path, options.size), options.size);
          } catch (const std::exception& error) {
            errors[i] = error.what();
          }
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    for (std::size_t i = 0; i < count; ++i) {
      if (!errors[i].empty()) {
        if (!options.skip_bad) throw data::DataError(errors[i]);
        std::fprintf(stderr, "convert_imagefolder: skipping: %s\n", errors[i].c_str());
        continue;
      }
      writer.add(pixels[i].data(), samples[start + i].label);
      ++written;
    }
  }
  const std::int64_t shards = writer.finish();
  std::printf("convert_imagefolder: %s: %lld images of %lldx%lld in %lld shards\n", split.c_str(),
              static_cast<long long>(written), static_cast<long long>(options.size),
              static_cast<long long>(options.size), static_cast<long long>(shards));
}

}  // namespace

int main(int argc, char** argv) {
  examples::Flags flags("convert_imagefolder",
                        "Converts an ImageFolder tree of JPEG files (root/<class>/*.jpg) into image shards.");
  flags.add("input", "", "root of the ImageFolder tree")
      .add("output", "", "directory for classes.txt and the shards (created if missing)")
      .add("size", "160", "side of the square images stored")
      .add("images-per-shard", "1024", "images in each shard file")
      .add("val-fraction", "0", "fraction of each class written to the val split instead of train")
      .add("seed", "0", "seed of the split and of the train shards' order")
      .add("threads", std::to_string(std::max(1u, std::thread::hardware_concurrency())), "decoding threads")
      .add_switch("skip-bad", "skip images that fail to decode (default: stop at the first)");
  flags.parse(argc, argv);
  if (flags.str("input").empty()) flags.fail("--input is required");
  if (flags.str("output").empty()) flags.fail("--output is required");
  const Options options{flags.integer("size"), flags.integer("images-per-shard"), flags.integer("threads"),
                        flags.on("skip-bad")};
  if (options.size < 1 || options.images_per_shard < 1 || options.threads < 1) {
    flags.fail("--size, --images-per-shard and --threads must be >= 1");
  }
  const double val_fraction = flags.real("val-fraction");
  if (!(val_fraction >= 0 && val_fraction < 1)) flags.fail("--val-fraction must be in [0, 1)");
  const auto seed = static_cast<std::uint64_t>(flags.integer("seed"));
  const std::string input = flags.str("input");
  const std::string output = flags.str("output");

  try {
    std::error_code error;
    if (!fs::is_directory(input, error)) throw data::DataError(input + ": no such directory");
    const std::vector<fs::path> class_directories = sorted_entries(input, /*directories=*/true);
    if (class_directories.empty()) throw data::DataError(input + ": no class directories (expected root/<class>/*.jpg)");
    std::vector<std::string> class_names;
    std::vector<Sample> train, val;
    for (const fs::path& directory : class_directories) {
      const auto label = static_cast<std::int32_t>(class_names.size());
      class_names.push_back(directory.filename().string());
      const std::vector<fs::path> files = sorted_entries(directory, /*directories=*/false);
      // Each class gives the same share to validation, chosen at random.
      const auto val_count = static_cast<std::size_t>(static_cast<double>(files.size()) * val_fraction);
      const std::vector<std::int64_t> order =
          data::shuffled_indices(static_cast<std::int64_t>(files.size()), data::mix_seed({seed, std::uint64_t(label)}));
      for (std::size_t i = 0; i < files.size(); ++i) {
        (i < val_count ? val : train).push_back({files[order[i]].string(), label});
      }
    }
    if (train.empty()) throw data::DataError(input + ": no .jpg or .jpeg files in its class directories");
    // Mixed classes in every shard, so a shard read alone is a fair sample.
    std::vector<Sample> shuffled;
    for (std::int64_t i : data::shuffled_indices(static_cast<std::int64_t>(train.size()), seed)) shuffled.push_back(train[i]);

    fs::create_directories(output, error);
    if (error) throw data::DataError("create directory " + output + ": " + error.message());
    convert(shuffled, output, "train", options);
    if (!val.empty()) convert(val, output, "val", options);
    data::write_class_names(output, class_names);
    std::printf("convert_imagefolder: %zu classes, names in %s/classes.txt\n", class_names.size(), output.c_str());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "convert_imagefolder: error: %s\n", error.what());
    return 1;
  }
  return 0;
}
