// make_images: a learnable image dataset in the shard format, for machines
// without ImageNet. Each class is a stripe period and a tint: an image is a
// sinusoidal grating of its class's period at a random angle and phase, its
// class's colour mixed with a random one, plus noise. Random angles make the
// classes survive the loader's flips and crops, so the validation accuracy a
// short run reaches says whether training works, and the shards exercise the
// real loader (crops, flips, pinned copies) at ImageNet's image size.
//
//   make_images --output /tmp/gratings --classes 10 --train 6000 --val 1000 --size 256

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "flags.h"
#include "images.h"
#include "random.h"

namespace {

constexpr double kPi = 3.14159265358979323846;

/// Uniform in [0, 1).
double uniform(data::SplitMix64& generator) { return static_cast<double>(generator.next() >> 11) * 0x1.0p-53; }

struct ClassLook {
  double period;     // pixels per stripe
  double colour[3];  // RGB in [0, 1]
};

/// Periods spread geometrically over [4, size / 4]; colours around the hue circle.
std::vector<ClassLook> class_looks(std::int64_t classes, std::int64_t size) {
  std::vector<ClassLook> looks(static_cast<std::size_t>(classes));
  const double shortest = 4.0, longest = std::max(8.0, static_cast<double>(size) / 4);
  for (std::int64_t c = 0; c < classes; ++c) {
    ClassLook& look = looks[static_cast<std::size_t>(c)];
    const double at = classes > 1 ? static_cast<double>(c) / static_cast<double>(classes - 1) : 0.0;
    look.period = shortest * std::pow(longest / shortest, at);
    const double hue = 2 * kPi * static_cast<double>(c) / static_cast<double>(classes);
    for (int k = 0; k < 3; ++k) look.colour[k] = 0.5 + 0.5 * std::cos(hue + 2 * kPi * k / 3.0);
  }
  return looks;
}

void draw(const ClassLook& look, std::int64_t size, data::SplitMix64& generator, std::vector<std::uint8_t>& pixels) {
  const double angle = kPi * uniform(generator), phase = 2 * kPi * uniform(generator);
  const double period = look.period * (0.9 + 0.2 * uniform(generator));
  const double dx = std::cos(angle) * 2 * kPi / period, dy = std::sin(angle) * 2 * kPi / period;
  double colour[3];
  const double mix = 0.6 + 0.3 * uniform(generator);  // the class colour's share against a random one
  for (double& c : colour) c = uniform(generator);
  for (int k = 0; k < 3; ++k) colour[k] = mix * look.colour[k] + (1 - mix) * colour[k];
  for (std::int64_t y = 0; y < size; ++y) {
    for (std::int64_t x = 0; x < size; ++x) {
      const double wave = 0.5 + 0.5 * std::sin(dx * static_cast<double>(x) + dy * static_cast<double>(y) + phase);
      for (int k = 0; k < 3; ++k) {
        const double noise = 0.3 * (uniform(generator) - 0.5);
        const double value = std::min(1.0, std::max(0.0, colour[k] * (0.3 + 0.7 * wave) + noise));
        pixels[static_cast<std::size_t>((y * size + x) * 3 + k)] = static_cast<std::uint8_t>(value * 255.0 + 0.5);
      }
    }
  }
}

/// Writes `count` images of random classes to one split; returns the shard count.
std::int64_t write_split(const std::string& directory, const std::string& split, std::int64_t count, std::int64_t size,
                         const std::vector<ClassLook>& looks, std::uint64_t seed) {
  data::ImageShardWriter writer(directory, split, size, size, /*images_per_shard=*/1000);
  data::SplitMix64 generator(seed);
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(size * size * 3));
  for (std::int64_t i = 0; i < count; ++i) {
    const auto label = static_cast<std::int32_t>(generator.below(looks.size()));
    draw(looks[static_cast<std::size_t>(label)], size, generator, pixels);
    writer.add(pixels.data(), label);
  }
  return writer.finish();
}

}  // namespace

int main(int argc, char** argv) {
  examples::Flags flags("make_images",
                        "Writes a learnable image dataset (striped gratings, a period and tint per class) as shards.");
  flags.add("output", "", "dataset directory to write (train/val shards and classes.txt)")
      .add("classes", "10", "number of classes (2 to 1000)")
      .add("train", "6000", "images in the train split")
      .add("val", "1000", "images in the val split")
      .add("size", "256", "side of the stored square images (the loader crops them)")
      .add("seed", "0", "random seed");
  flags.parse(argc, argv);
  const std::int64_t classes = flags.integer("classes"), size = flags.integer("size");
  const std::int64_t train = flags.integer("train"), val = flags.integer("val");
  if (flags.str("output").empty()) flags.fail("--output is required");
  if (classes < 2 || classes > 1000) flags.fail("--classes must be in [2, 1000]");
  if (size < 32) flags.fail("--size must be at least 32");
  if (train < 1 || val < 1) flags.fail("--train and --val must be at least 1");
  try {
    const std::string directory = flags.str("output");
    std::filesystem::create_directories(directory);
    const auto looks = class_looks(classes, size);
    const auto seed = static_cast<std::uint64_t>(flags.integer("seed"));
    const std::int64_t train_shards = write_split(directory, "train", train, size, looks, data::mix_seed({seed, 0}));
    const std::int64_t val_shards = write_split(directory, "val", val, size, looks, data::mix_seed({seed, 1}));
    std::vector<std::string> names;
    for (std::int64_t c = 0; c < classes; ++c) {
      char name[64];
      std::snprintf(name, sizeof name, "period%.1f", looks[static_cast<std::size_t>(c)].period);
      names.emplace_back(name);
    }
    data::write_class_names(directory, names);
    std::printf(
        "make_images: wrote %lld train images (%lld shards) and %lld val images (%lld shards), %lld x %lld, "
        "%lld classes, to %s\n",
        static_cast<long long>(train), static_cast<long long>(train_shards), static_cast<long long>(val),
        static_cast<long long>(val_shards), static_cast<long long>(size), static_cast<long long>(size),
        static_cast<long long>(classes), directory.c_str());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "make_images: error: %s\n", error.what());
    return 1;
  }
  return 0;
}
