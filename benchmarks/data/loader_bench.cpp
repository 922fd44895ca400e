// How many images per second the image-shard loader delivers to the device:
// ImageLoader's worker threads crop and flip into pinned host batches, next()
// copies each to the device and normalises it there. Nothing trains, so this
// is the rate the loader alone can sustain, to hold against the training
// img/s of the same configuration (a trainer faster than this waits for data).
//
//   make_images --output /tmp/gratings --size 256
//   loader_bench --data /tmp/gratings --batch 128 --crop 224 --workers 6 --batches 200

#include <chrono>
#include <cstdio>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <fmt/format.h>

#include "common/run_info.h"
#include "flags.h"
#include "images.h"

int main(int argc, char** argv) try {
  examples::Flags flags("loader_bench", "Images per second from the image-shard loader to the GPU, without training.");
  flags.add("data", "", "dataset directory of image shards (make_images or convert_imagefolder)")
      .add("split", "train", "train (random crops and flips) or val (center crops)")
      .add("batch", "128", "images per batch")
      .add("crop", "224", "side of the crops")
      .add("workers", "6", "loader threads (train_resnet50's default)")
      .add("batches", "200", "timed batches")
      .add("warmup", "20", "batches drawn before the clock starts");
  flags.parse(argc, argv);
  if (flags.str("data").empty()) flags.fail("--data is required");
  const std::string split = flags.str("split");
  if (split != "train" && split != "val") flags.fail("--split must be train or val");
  const std::int64_t batches = flags.integer("batches"), warmup = flags.integer("warmup");
  if (batches < 1 || warmup < 0) flags.fail("--batches must be >= 1 and --warmup >= 0");

  auto dataset = std::make_shared<const data::ImageShardDataset>(flags.str("data"), split);
  data::ImageLoaderOptions options;
  options.batch_size = flags.integer("batch");
  options.crop_size = flags.integer("crop");
  options.workers = flags.integer("workers");
  options.train = split == "train";
  options.device = at::Device(at::kCUDA, 0);
  data::ImageLoader loader(dataset, options);

  for (std::int64_t i = 0; i < warmup; ++i) loader.next();
  c10::cuda::device_synchronize();
  const auto start = std::chrono::steady_clock::now();
  at::Tensor checksum = at::zeros({}, at::TensorOptions().device(options.device));
  for (std::int64_t i = 0; i < batches; ++i) {
    // Reading each batch on the device keeps the copies from being skipped
    // and orders them as a trainer's use would.
    checksum += loader.next().images.sum();
  }
  c10::cuda::device_synchronize();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double images_per_second = static_cast<double>(batches * options.batch_size) / seconds;
  const bench::RunInfo info = bench::run_info(0);
  std::printf("%s\n", fmt::format("{{\"bench\": \"loader\", \"gpu\": \"{}\", \"date\": \"{}\", \"commit\": \"{}\", "
                                  "\"split\": \"{}\", \"stored\": {}, \"crop\": {}, \"batch\": {}, \"workers\": {}, "
                                  "\"batches\": {}, \"seconds\": {:.3f}, \"img_per_s\": {:.0f}, \"checksum\": {:.6g}}}",
                                  info.gpu, info.date, info.commit, split, dataset->height(), options.crop_size,
                                  options.batch_size, options.workers, batches, seconds, images_per_second,
                                  checksum.item<double>())
                          .c_str());
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "loader_bench: error: %s\n", error.what());
  return 1;
}
