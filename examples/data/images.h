#pragma once

// Image data for ResNet training: shards of decoded, resized images, the
// multi-threaded loader that turns them into normalised device batches, and a
// synthetic source with the same interface.
//
// Shard file layout, version 1 (all integers little-endian):
//   bytes 0 .. 7     magic "DDPIMGS\0"
//   bytes 8 .. 31    uint32 version (1), count, height, width, channels (3), reserved (0)
//   bytes 32 ..      int32 labels[count]
//   then             uint8 pixels[count][height][width][channels], RGB
// A dataset directory holds classes.txt (line i names label i) and the shards
// of each split, named <split>-00000.shard, <split>-00001.shard, ...; every
// shard of a split has the same height and width. docs/data_formats.md has the
// same description.

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>

#include "io.h"

namespace data {

constexpr char kShardMagic[8] = {'D', 'D', 'P', 'I', 'M', 'G', 'S', '\0'};
constexpr std::uint32_t kShardVersion = 1;

/// Line i of <directory>/classes.txt names label i.
void write_class_names(const std::string& directory, const std::vector<std::string>& names);
std::vector<std::string> read_class_names(const std::string& directory);

/// "<directory>/<split>-<index, 5 digits>.shard"
std::string shard_path(const std::string& directory, const std::string& split, std::int64_t index);

/// Appends images to the shards of one split, images_per_shard to a file.
class ImageShardWriter {
 public:
  ImageShardWriter(std::string directory, std::string split, std::int64_t height, std::int64_t width,
                   std::int64_t images_per_shard);

  /// `pixels`: height * width * 3 bytes, HWC RGB.
  void add(const std::uint8_t* pixels, std::int32_t label);
  /// Writes the last, partly filled shard and removes higher-numbered shards
  /// of this split an earlier dataset left there. Returns the number of shards.
  std::int64_t finish();

 private:
  void flush();

  std::string directory_;
  std::string split_;
  std::int64_t height_, width_, images_per_shard_;
  std::vector<std::int32_t> labels_;
  std::vector<std::uint8_t> pixels_;
  std::int64_t shards_ = 0;
};

/// All shards of one split, memory-mapped. Throws DataError naming the file
/// for a missing directory, no shards, a bad header or a label without a class.
class ImageShardDataset {
 public:
  ImageShardDataset(const std::string& directory, const std::string& split);

  std::int64_t size() const { return size_; }
  std::int64_t height() const { return height_; }
  std::int64_t width() const { return width_; }
  const std::vector<std::string>& class_names() const { return class_names_; }

  std::int32_t label(std::int64_t index) const;
  /// height * width * 3 bytes, HWC RGB.
  const std::uint8_t* pixels(std::int64_t index) const;

 private:
  struct Shard {
    MappedFile file;
    const std::int32_t* labels;
    const std::uint8_t* pixels;
  };
  std::pair<const Shard*, std::int64_t> locate(std::int64_t index) const;

  std::vector<std::string> class_names_;
  std::vector<Shard> shards_;
  std::vector<std::int64_t> starts_;  // index of each shard's first image
  std::int64_t size_ = 0, height_ = 0, width_ = 0;
};

struct ImageLoaderOptions {
  std::int64_t batch_size = 32;  // images per batch on each rank
  std::int64_t rank = 0;
  std::int64_t world_size = 1;
  std::uint64_t seed = 0;
  /// Training: a new random order each epoch (from seed and epoch), random
  /// crop and horizontal flip, and the epoch's last partial batch dropped so
  /// all ranks take the same number of steps. Validation (false): file order,
  /// center crop, every image exactly once over all ranks, so ranks may
  /// differ by one batch: reduce the results once, after the loop.
  bool train = true;
  std::int64_t crop_size = 0;  // square side of the output; 0: the stored height
  std::int64_t workers = 4;    // threads assembling batches
  std::int64_t prefetch = 4;   // batches assembled ahead of the trainer
  at::Device device = at::kCPU;
  bool channels_last = true;  // memory format of the images
  /// Training: batches each rank draws per optimizer step (gradient accumulation).
  std::int64_t batches_per_step = 1;
  /// Training: an epoch's images rarely fill whole steps of every rank:
  /// false drops the leftover, true deals it out as one more step to as many
  /// ranks as it fills (world_size * batches_per_step batches of batch_size
  /// make a whole step; the others have no batch then: train that step under
  /// ddp::Join). Less than one rank's step is still dropped.
  bool uneven_tail = false;
};

/// Where a stream of batches stands: the next batch is `batch` of `epoch`.
struct ImagePosition {
  std::int64_t epoch = 0;
  std::int64_t batch = 0;
};

struct ImageBatch {
  at::Tensor images;   // [B, 3, H, W] float, ImageNet-normalised, on the device
  at::Tensor labels;   // [B] int64, on the device
  at::Tensor indices;  // [B] int64 sample numbers, on the CPU (for checks and debugging)
};

/// What an image-classification trainer draws batches from. next() goes on
/// across epochs forever; a trainer that counts epochs reads position().
class ImageSource {
 public:
  virtual ~ImageSource() = default;
  virtual ImageBatch next() = 0;
  virtual std::int64_t batches_per_epoch() const = 0;
  virtual ImagePosition position() const = 0;
  virtual void seek(ImagePosition position) = 0;
  /// Whether the next step is an epoch's uneven tail (the same on every
  /// rank): only ranks with has_step_here() have its batches.
  virtual bool uneven_step_next() const { return false; }
  virtual bool has_step_here() const { return true; }
  /// A rank without the tail step's batches moves past them, as the others draw them.
  virtual void skip_step() {}
};

/// uint8 NHWC images -> float NCHW, (x / 255 - mean) / std with ImageNet's
/// mean and std, on the device the images are on. NHWC permuted to NCHW is
/// channels_last already, so that layout costs no copy.
class ImageNormalizer {
 public:
  ImageNormalizer(at::Device device, bool channels_last);
  at::Tensor operator()(const at::Tensor& nhwc) const;

 private:
  at::Tensor scale_, shift_;  // [1, 3, 1, 1] on the device
  bool channels_last_;
};

/// Batches from image shards. Each rank takes every world_size-th image of
/// the epoch's order, starting at its rank, so ranks never share an image;
/// with uneven_tail the images left after the whole steps follow, one
/// step's worth per rank, rank after rank.
/// Worker threads crop and flip into (pinned, with a CUDA device) host memory
/// up to `prefetch` batches ahead; next() copies a batch to the device without
/// blocking and normalises it there, in the current stream, so the copy is
/// ordered before the trainer's use of it. Augmentation draws from (seed,
/// epoch, image), so batches do not depend on which thread made them.
class ImageLoader : public ImageSource {
 public:
  ImageLoader(std::shared_ptr<const ImageShardDataset> dataset, ImageLoaderOptions options);
  /// Stops and joins the workers, also in the middle of an epoch.
  ~ImageLoader() override;
  ImageLoader(const ImageLoader&) = delete;
  ImageLoader& operator=(const ImageLoader&) = delete;

  ImageBatch next() override;
  std::int64_t batches_per_epoch() const override { return batches_per_epoch_; }
  ImagePosition position() const override;
  /// Drops what was prefetched and continues at `position`.
  void seek(ImagePosition position) override;
  bool uneven_step_next() const override;
  bool has_step_here() const override { return !uneven_step_next() || options_.rank < tail_ranks_; }
  void skip_step() override;

 private:
  struct HostBatch {
    at::Tensor pixels, labels, indices;
    std::exception_ptr error;
  };
  void start_workers();
  void stop_workers();
  void work();
  /// The next batch in host memory, waiting for the workers if needed.
  HostBatch take();
  HostBatch assemble(std::int64_t batch_number);
  /// Where image `i` of this rank's batch `batch` lies in the epoch's order.
  std::int64_t order_index(std::int64_t batch, std::int64_t i) const;
  std::shared_ptr<const std::vector<std::int64_t>> order_of(std::int64_t epoch);

  std::shared_ptr<const ImageShardDataset> dataset_;
  ImageLoaderOptions options_;
  std::int64_t crop_ = 0;
  std::int64_t images_per_epoch_ = 0;  // this rank's
  std::int64_t batches_per_epoch_ = 0;
  std::int64_t whole_batches_ = 0;  // training: per epoch and rank, in the steps every rank takes
  std::int64_t tail_ranks_ = 0;     // uneven_tail: ranks with one more step at the epoch's end
  bool pin_ = false;
  ImageNormalizer normalize_;

  // Batch numbers count from epoch 0, batch 0; workers and the trainer count
  // from the last seek.
  std::mutex mutex_;
  std::condition_variable work_wanted_, batch_ready_;
  bool stopping_ = false;
  std::int64_t first_ = 0;
  std::int64_t handed_out_ = 0;
  std::int64_t claimed_ = 0;
  std::map<std::int64_t, HostBatch> ready_;
  std::vector<std::thread> workers_;

  std::mutex order_mutex_;
  std::map<std::int64_t, std::shared_ptr<const std::vector<std::int64_t>>> orders_;
};

/// Synthetic ImageNet-shaped batches (the trainer's default, so it runs
/// without files): a pool of random images with random labels, made once on
/// the device; batch k is a slice of it chosen from (seed, rank, k), so ranks
/// differ, reruns repeat, and a model can fit the pool (the loss falls).
/// Output has the same type, layout and normalisation as ImageLoader's.
class SyntheticImages : public ImageSource {
 public:
  /// Uses batch_size, rank, world_size, seed, device, channels_last and
  /// crop_size (0: 224) of `options`.
  SyntheticImages(ImageLoaderOptions options, std::int64_t num_classes = 1000,
                  std::int64_t batches_per_epoch = 1000);

  ImageBatch next() override;
  std::int64_t batches_per_epoch() const override { return batches_per_epoch_; }
  ImagePosition position() const override;
  void seek(ImagePosition position) override;

 private:
  ImageLoaderOptions options_;
  std::int64_t batches_per_epoch_;
  ImageNormalizer normalize_;
  at::Tensor pool_;         // [P, S, S, 3] uint8 on the device
  at::Tensor pool_labels_;  // [P] int64 on the device
  std::int64_t batch_number_ = 0;
};

}  // namespace data
