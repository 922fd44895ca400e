#include "images.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <stdexcept>
#include <system_error>

#include "random.h"

namespace data {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "image shards are read in place: little-endian hosts only");

namespace {

struct ShardHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t count;
  std::uint32_t height;
  std::uint32_t width;
  std::uint32_t channels;
  std::uint32_t reserved;
};
static_assert(sizeof(ShardHeader) == 32, "the shard header is 32 bytes on disk");

constexpr std::int64_t kChannels = 3;
constexpr float kMean[3] = {0.485f, 0.456f, 0.406f};
constexpr float kStd[3] = {0.229f, 0.224f, 0.225f};

std::string classes_path(const std::string& directory) { return directory + "/classes.txt"; }

void check_options(const ImageLoaderOptions& options) {
  if (options.batch_size < 1) throw std::invalid_argument("image loader: batch_size must be >= 1");
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    throw std::invalid_argument("image loader: rank " + std::to_string(options.rank) + " is not in [0, world_size " +
                                std::to_string(options.world_size) + ")");
  }
  if (options.workers < 1 || options.prefetch < 1) {
    throw std::invalid_argument("image loader: workers and prefetch must be >= 1");
  }
  if (options.crop_size < 0) throw std::invalid_argument("image loader: crop_size must be >= 0");
  if (options.batches_per_step < 1) throw std::invalid_argument("image loader: batches_per_step must be >= 1");
}

std::int64_t linear(ImagePosition position, std::int64_t batches_per_epoch) {
  if (position.epoch < 0 || position.batch < 0 || position.batch > batches_per_epoch) {
    throw std::invalid_argument("image loader: cannot seek to epoch " + std::to_string(position.epoch) + " batch " +
                                std::to_string(position.batch) + " of an epoch of " +
                                std::to_string(batches_per_epoch) +
                                " batches (a checkpoint from another batch size or world size?)");
  }
  return position.epoch * batches_per_epoch + position.batch;
}

ImagePosition split(std::int64_t batch_number, std::int64_t batches_per_epoch) {
  return {batch_number / batches_per_epoch, batch_number % batches_per_epoch};
}

}  // namespace

void write_class_names(const std::string& directory, const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) {
    if (name.empty() || name.find('\n') != std::string::npos) {
      throw DataError(classes_path(directory) + ": class name '" + name + "' is empty or spans lines");
    }
    text += name + "\n";
  }
  AtomicFileWriter writer(classes_path(directory));
  writer.write(text.data(), text.size());
  writer.commit();
}

std::vector<std::string> read_class_names(const std::string& directory) {
  const std::string path = classes_path(directory);
  std::ifstream file(path);
  if (!file) throw_errno("open", path);
  std::vector<std::string> names;
  for (std::string line; std::getline(file, line);) {
    if (line.empty()) throw DataError(path + ": line " + std::to_string(names.size() + 1) + " names no class");
    names.push_back(line);
  }
  if (file.bad()) throw_errno("read", path);
  if (names.empty()) throw DataError(path + ": names no classes");
  return names;
}

std::string shard_path(const std::string& directory, const std::string& split, std::int64_t index) {
  char number[16];
  std::snprintf(number, sizeof number, "%05lld", static_cast<long long>(index));
  return directory + "/" + split + "-" + number + ".shard";
}

ImageShardWriter::ImageShardWriter(std::string directory, std::string split, std::int64_t height, std::int64_t width,
                                   std::int64_t images_per_shard)
    : directory_(std::move(directory)),
      split_(std::move(split)),
      height_(height),
      width_(width),
      images_per_shard_(images_per_shard) {
  if (height < 1 || width < 1 || images_per_shard < 1) {
    throw std::invalid_argument("image shard writer: height, width and images_per_shard must be >= 1");
  }
}

void ImageShardWriter::add(const std::uint8_t* pixels, std::int32_t label) {
  labels_.push_back(label);
  pixels_.insert(pixels_.end(), pixels, pixels + height_ * width_ * kChannels);
  if (static_cast<std::int64_t>(labels_.size()) == images_per_shard_) flush();
}

std::int64_t ImageShardWriter::finish() {
  if (!labels_.empty()) flush();
  // A dataset written here before may have had more shards of this split,
  // which a reader would take as part of this one.
  for (std::int64_t index = shards_; std::filesystem::remove(shard_path(directory_, split_, index)); ++index) {
  }
  return shards_;
}

void ImageShardWriter::flush() {
  ShardHeader header{};
  std::memcpy(header.magic, kShardMagic, sizeof header.magic);
  header.version = kShardVersion;
  header.count = static_cast<std::uint32_t>(labels_.size());
  header.height = static_cast<std::uint32_t>(height_);
  header.width = static_cast<std::uint32_t>(width_);
  header.channels = kChannels;
  AtomicFileWriter writer(shard_path(directory_, split_, shards_));
  writer.write(&header, sizeof header);
  writer.write(labels_.data(), labels_.size() * sizeof(std::int32_t));
  writer.write(pixels_.data(), pixels_.size());
  writer.commit();
  ++shards_;
  labels_.clear();
  pixels_.clear();
}

ImageShardDataset::ImageShardDataset(const std::string& directory, const std::string& split) {
  std::error_code error;
  if (!std::filesystem::is_directory(directory, error)) {
    throw DataError(directory + ": no such dataset directory" + (error ? " (" + error.message() + ")" : ""));
  }
  class_names_ = read_class_names(directory);

  std::vector<std::string> paths;
  const std::string prefix = split + "-";
  std::filesystem::directory_iterator entries(directory, error);
  if (error) throw DataError("list " + directory + ": " + error.message());
  for (const auto& entry : entries) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && entry.path().extension() == ".shard") paths.push_back(entry.path().string());
  }
  if (paths.empty()) throw DataError(directory + ": no " + split + "-*.shard files");
  std::sort(paths.begin(), paths.end());

  for (const std::string& path : paths) {
    MappedFile file(path);
    ShardHeader header{};
    if (file.size() < sizeof header) {
      throw DataError(path + ": truncated image shard: " + std::to_string(file.size()) + " bytes, less than a header");
    }
    std::memcpy(&header, file.data(), sizeof header);
    if (std::memcmp(header.magic, kShardMagic, sizeof header.magic) != 0) {
      throw DataError(path + ": wrong magic, not an image shard");
    }
    if (header.version != kShardVersion || header.channels != kChannels) {
      throw DataError(path + ": unsupported image shard version " + std::to_string(header.version) + " with " +
                      std::to_string(header.channels) + " channels (this reader knows version 1, 3 channels)");
    }
    const std::int64_t count = header.count;
    const std::int64_t image_bytes = std::int64_t{header.height} * header.width * kChannels;
    const std::int64_t expected = static_cast<std::int64_t>(sizeof header) + count * (4 + image_bytes);
    if (expected != static_cast<std::int64_t>(file.size())) {
      throw DataError(path + ": corrupt image shard: its header says " + std::to_string(count) + " images of " +
                      std::to_string(header.height) + "x" + std::to_string(header.width) + ", which make " +
                      std::to_string(expected) + " bytes, but the file has " + std::to_string(file.size()));
    }
    if (shards_.empty()) {
      height_ = header.height;
      width_ = header.width;
    } else if (header.height != height_ || header.width != width_) {
      throw DataError(path + ": images of " + std::to_string(header.height) + "x" + std::to_string(header.width) +
                      ", but " + paths.front() + " has " + std::to_string(height_) + "x" + std::to_string(width_));
    }
    const auto* labels = reinterpret_cast<const std::int32_t*>(file.data() + sizeof header);
    const auto bad = std::find_if(labels, labels + count, [&](std::int32_t label) {
      return label < 0 || label >= static_cast<std::int64_t>(class_names_.size());
    });
    if (bad != labels + count) {
      throw DataError(path + ": image " + std::to_string(bad - labels) + " has label " + std::to_string(*bad) +
                      ", but " + classes_path(directory) + " names " + std::to_string(class_names_.size()) +
                      " classes");
    }
    const auto* pixels = reinterpret_cast<const std::uint8_t*>(labels + count);
    starts_.push_back(size_);
    size_ += count;
    shards_.push_back(Shard{std::move(file), labels, pixels});
  }
}

std::pair<const ImageShardDataset::Shard*, std::int64_t> ImageShardDataset::locate(std::int64_t index) const {
  if (index < 0 || index >= size_) {
    throw std::out_of_range("image " + std::to_string(index) + " outside the dataset's " + std::to_string(size_));
  }
  const std::size_t shard = std::upper_bound(starts_.begin(), starts_.end(), index) - starts_.begin() - 1;
  return {&shards_[shard], index - starts_[shard]};
}

std::int32_t ImageShardDataset::label(std::int64_t index) const {
  const auto [shard, local] = locate(index);
  return shard->labels[local];
}

const std::uint8_t* ImageShardDataset::pixels(std::int64_t index) const {
  const auto [shard, local] = locate(index);
  return shard->pixels + local * height_ * width_ * kChannels;
}

ImageNormalizer::ImageNormalizer(at::Device device, bool channels_last) : channels_last_(channels_last) {
  std::vector<float> scale, shift;
  for (int c = 0; c < 3; ++c) {
    scale.push_back(1.0f / (255.0f * kStd[c]));
    shift.push_back(-kMean[c] / kStd[c]);
  }
  // Made once: a small copy to the device per batch would wait for the GPU.
  scale_ = at::tensor(scale).view({1, 3, 1, 1}).to(device);
  shift_ = at::tensor(shift).view({1, 3, 1, 1}).to(device);
}

at::Tensor ImageNormalizer::operator()(const at::Tensor& nhwc) const {
  at::Tensor images = nhwc.permute({0, 3, 1, 2}).to(at::kFloat);
  images = images.contiguous(channels_last_ ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous);
  return images.mul_(scale_).add_(shift_);
}

ImageLoader::ImageLoader(std::shared_ptr<const ImageShardDataset> dataset, ImageLoaderOptions options)
    : dataset_(std::move(dataset)),
      options_(options),
      pin_(options.device.is_cuda()),
      normalize_(options.device, options.channels_last) {
  check_options(options_);
  crop_ = options_.crop_size > 0 ? options_.crop_size : dataset_->height();
  if (crop_ > dataset_->height() || crop_ > dataset_->width()) {
    throw std::invalid_argument("image loader: crop " + std::to_string(crop_) + " is larger than the stored " +
                                std::to_string(dataset_->height()) + "x" + std::to_string(dataset_->width()));
  }
  const std::int64_t n = dataset_->size();
  const std::int64_t world = options_.world_size;
  const std::int64_t batch = options_.batch_size;
  if (options_.train) {
    images_per_epoch_ = n / world;
    batches_per_epoch_ = images_per_epoch_ / batch;
    if (options_.uneven_tail) {
      const std::int64_t step_images = batch * options_.batches_per_step;  // one rank's step
      const std::int64_t whole_steps = n / (world * step_images);
      whole_batches_ = whole_steps * options_.batches_per_step;
      tail_ranks_ = (n - whole_steps * world * step_images) / step_images;
      batches_per_epoch_ = whole_batches_ + (tail_ranks_ > 0 ? options_.batches_per_step : 0);
      images_per_epoch_ = batches_per_epoch_ * batch;
    }
  } else {
    images_per_epoch_ = (n - options_.rank + world - 1) / world;
    batches_per_epoch_ = (images_per_epoch_ + batch - 1) / batch;
  }
  if (!options_.train || !options_.uneven_tail) whole_batches_ = batches_per_epoch_;
  if (batches_per_epoch_ == 0) {
    throw DataError("image dataset of " + std::to_string(n) + " images is too small for " + std::to_string(world) +
                    " ranks x batches of " + std::to_string(batch));
  }
  start_workers();
}

ImageLoader::~ImageLoader() { stop_workers(); }

void ImageLoader::start_workers() {
  stopping_ = false;
  for (std::int64_t i = 0; i < options_.workers; ++i) workers_.emplace_back([this] { work(); });
}

void ImageLoader::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_wanted_.notify_all();
  for (std::thread& worker : workers_) worker.join();
  workers_.clear();
}

void ImageLoader::work() {
  for (;;) {
    std::int64_t number = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_wanted_.wait(lock, [this] { return stopping_ || claimed_ < handed_out_ + options_.prefetch; });
      if (stopping_) return;
      number = claimed_++;
    }
    HostBatch batch;
    try {
      batch = assemble(first_ + number);
    } catch (...) {
      // Handed to the trainer's thread, which rethrows it from next().
      batch.error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ready_.emplace(number, std::move(batch));
    }
    batch_ready_.notify_all();
  }
}

std::shared_ptr<const std::vector<std::int64_t>> ImageLoader::order_of(std::int64_t epoch) {
  std::lock_guard<std::mutex> lock(order_mutex_);
  auto found = orders_.find(epoch);
  if (found != orders_.end()) return found->second;
  std::vector<std::int64_t> order;
  if (options_.train) {
    order = shuffled_indices(dataset_->size(), mix_seed({options_.seed, static_cast<std::uint64_t>(epoch)}));
  } else {
    order.resize(static_cast<std::size_t>(dataset_->size()));
    std::iota(order.begin(), order.end(), 0);
  }
  // Workers straddle at most two epochs: keep this one and the one before.
  orders_.erase(orders_.begin(), orders_.lower_bound(epoch - 1));
  return orders_.emplace(epoch, std::make_shared<const std::vector<std::int64_t>>(std::move(order))).first->second;
}

ImageLoader::HostBatch ImageLoader::assemble(std::int64_t batch_number) {
  const auto [epoch, batch] = split(batch_number, batches_per_epoch_);
  const auto order = order_of(epoch);
  const std::int64_t first = batch * options_.batch_size;
  const bool absent = batch >= whole_batches_ && options_.uneven_tail && options_.rank >= tail_ranks_;
  const std::int64_t count = absent ? 0 : std::min(options_.batch_size, images_per_epoch_ - first);
  const std::int64_t height = dataset_->height();
  const std::int64_t width = dataset_->width();
  const std::int64_t row_bytes = crop_ * kChannels;

  HostBatch out;
  const auto host = at::TensorOptions().pinned_memory(pin_);
  out.pixels = at::empty({count, crop_, crop_, kChannels}, host.dtype(at::kByte));
  out.labels = at::empty({count}, host.dtype(at::kLong));
  out.indices = at::empty({count}, at::kLong);
  std::uint8_t* pixels = out.pixels.data_ptr<std::uint8_t>();
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t index = (*order)[order_index(batch, i)];
    out.indices.data_ptr<std::int64_t>()[i] = index;
    out.labels.data_ptr<std::int64_t>()[i] = dataset_->label(index);
    std::int64_t top = (height - crop_) / 2;
    std::int64_t left = (width - crop_) / 2;
    bool flip = false;
    if (options_.train) {
      SplitMix64 generator(mix_seed({options_.seed, static_cast<std::uint64_t>(epoch), static_cast<std::uint64_t>(index)}));
      top = static_cast<std::int64_t>(generator.below(height - crop_ + 1));
      left = static_cast<std::int64_t>(generator.below(width - crop_ + 1));
      flip = generator.below(2) == 1;
    }
    const std::uint8_t* source = dataset_->pixels(index);
    std::uint8_t* target = pixels + i * crop_ * row_bytes;
    for (std::int64_t y = 0; y < crop_; ++y) {
      const std::uint8_t* from = source + ((top + y) * width + left) * kChannels;
      std::uint8_t* to = target + y * row_bytes;
      if (!flip) {
        std::memcpy(to, from, row_bytes);
        continue;
      }
      for (std::int64_t x = 0; x < crop_; ++x) {
        std::memcpy(to + x * kChannels, from + (crop_ - 1 - x) * kChannels, kChannels);
      }
    }
  }
  return out;
}

std::int64_t ImageLoader::order_index(std::int64_t batch, std::int64_t i) const {
  const std::int64_t size = options_.batch_size;
  if (batch < whole_batches_) return (batch * size + i) * options_.world_size + options_.rank;
  // The uneven tail: after the whole steps' images, one step's worth per rank.
  const std::int64_t tail_start = whole_batches_ * size * options_.world_size;
  return tail_start + (options_.rank * options_.batches_per_step + batch - whole_batches_) * size + i;
}

ImageLoader::HostBatch ImageLoader::take() {
  HostBatch host;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    batch_ready_.wait(lock, [this] { return ready_.count(handed_out_) > 0; });
    auto node = ready_.extract(handed_out_);
    host = std::move(node.mapped());
    ++handed_out_;
  }
  work_wanted_.notify_all();
  if (host.error) std::rethrow_exception(host.error);
  return host;
}

bool ImageLoader::uneven_step_next() const {
  return options_.train && options_.uneven_tail && position().batch >= whole_batches_;
}

void ImageLoader::skip_step() {
  for (std::int64_t batch = 0; batch < options_.batches_per_step; ++batch) take();
}

ImageBatch ImageLoader::next() {
  const HostBatch host = take();
  // Non-blocking from pinned memory: the copy is queued on the current stream
  // and the caching host allocator keeps the buffer until it has run.
  const at::Tensor pixels = host.pixels.to(options_.device, at::kByte, /*non_blocking=*/true);
  const at::Tensor labels = host.labels.to(options_.device, at::kLong, /*non_blocking=*/true);
  return {normalize_(pixels), labels, host.indices};
}

ImagePosition ImageLoader::position() const {
  // handed_out_ changes only in the trainer's own thread (next, seek).
  return split(first_ + handed_out_, batches_per_epoch_);
}

void ImageLoader::seek(ImagePosition position) {
  const std::int64_t number = linear(position, batches_per_epoch_);
  stop_workers();
  ready_.clear();
  first_ = number;
  handed_out_ = 0;
  claimed_ = 0;
  start_workers();
}

SyntheticImages::SyntheticImages(ImageLoaderOptions options, std::int64_t num_classes, std::int64_t batches_per_epoch)
    : options_(options), batches_per_epoch_(batches_per_epoch), normalize_(options.device, options.channels_last) {
  check_options(options_);
  if (num_classes < 1 || batches_per_epoch < 1) {
    throw std::invalid_argument("synthetic images: num_classes and batches_per_epoch must be >= 1");
  }
  const std::int64_t size = options_.crop_size > 0 ? options_.crop_size : 224;
  // Twice a batch: batches vary, and the pool stays small on the device.
  const std::int64_t pool = 2 * options_.batch_size;
  at::Tensor pixels = at::empty({pool, size, size, kChannels}, at::kByte);
  at::Tensor labels = at::empty({pool}, at::kLong);
  SplitMix64 generator(mix_seed({options_.seed}));
  std::uint8_t* bytes = pixels.data_ptr<std::uint8_t>();
  for (std::int64_t i = 0; i < pixels.numel(); ++i) bytes[i] = static_cast<std::uint8_t>(generator.next() >> 56);
  for (std::int64_t i = 0; i < pool; ++i) {
    labels.data_ptr<std::int64_t>()[i] = static_cast<std::int64_t>(generator.below(num_classes));
  }
  pool_ = pixels.to(options_.device);
  pool_labels_ = labels.to(options_.device);
}

ImageBatch SyntheticImages::next() {
  const std::int64_t batch = options_.batch_size;
  SplitMix64 generator(mix_seed({options_.seed, static_cast<std::uint64_t>(options_.rank),
                                 static_cast<std::uint64_t>(batch_number_)}));
  // A slice of the pool is a view: nothing moves between host and device.
  const std::int64_t first = static_cast<std::int64_t>(generator.below(pool_.size(0) - batch + 1));
  ++batch_number_;
  return {normalize_(pool_.narrow(0, first, batch)), pool_labels_.narrow(0, first, batch),
          at::arange(first, first + batch, at::kLong)};
}

ImagePosition SyntheticImages::position() const { return split(batch_number_, batches_per_epoch_); }

void SyntheticImages::seek(ImagePosition position) { batch_number_ = linear(position, batches_per_epoch_); }

}  // namespace data
