#include "jpeg_io.h"

#include <csetjmp>
#include <cstdio>
// jpeglib.h needs FILE and size_t declared before it.
#include <jpeglib.h>

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>

#include "io.h"

namespace tools {
namespace {

// libjpeg reports errors by calling error_exit, which must not return. It
// longjmps back to the function that called setjmp; C++ exceptions are not
// thrown through libjpeg's C frames. The functions that call setjmp keep only
// trivially destructible locals, so the jump skips no destructor.
struct ErrorManager {
  jpeg_error_mgr base;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void on_error(j_common_ptr info) {
  auto* manager = reinterpret_cast<ErrorManager*>(info->err);
  (*info->err->format_message)(info, manager->message);
  std::longjmp(manager->jump, 1);
}

// Warnings (corrupt but decodable data) are common in real datasets; libjpeg's
// default prints them, which would flood the converter's output.
void on_warning(j_common_ptr, int) {}

class StdioFile {
 public:
  StdioFile(const std::string& path, const char* mode) : path_(path), file_(std::fopen(path.c_str(), mode)) {
    if (file_ == nullptr) data::throw_errno("fopen", path);
  }
  ~StdioFile() {
    if (file_ != nullptr) std::fclose(file_);
  }
  StdioFile(const StdioFile&) = delete;
  StdioFile& operator=(const StdioFile&) = delete;
  FILE* get() const { return file_; }
  void close() {
    FILE* file = file_;
    file_ = nullptr;
    if (std::fclose(file) != 0) data::throw_errno("fclose", path_);
  }

 private:
  std::string path_;
  FILE* file_;
};

// Adobe's CMYK JPEGs store the ink inverted; plain ones do not.
void cmyk_to_rgb(const JSAMPLE* cmyk, std::int64_t pixels, bool inverted, std::uint8_t* rgb) {
  for (std::int64_t i = 0; i < pixels; ++i, cmyk += 4, rgb += 3) {
    const int k = inverted ? cmyk[3] : 255 - cmyk[3];
    for (int c = 0; c < 3; ++c) rgb[c] = static_cast<std::uint8_t>((inverted ? cmyk[c] : 255 - cmyk[c]) * k / 255);
  }
}

// Returns false with manager->message set when libjpeg fails.
bool decode(FILE* file, std::int64_t min_side, ErrorManager* manager, RgbImage* image, std::vector<JSAMPLE>* row) {
  jpeg_decompress_struct info;
  info.err = jpeg_std_error(&manager->base);
  manager->base.error_exit = on_error;
  manager->base.emit_message = on_warning;
  if (setjmp(manager->jump)) {
    jpeg_destroy_decompress(&info);
    return false;
  }
  jpeg_create_decompress(&info);
  jpeg_stdio_src(&info, file);
  jpeg_read_header(&info, TRUE);
  const bool cmyk = info.jpeg_color_space == JCS_CMYK || info.jpeg_color_space == JCS_YCCK;
  info.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  const std::int64_t shorter = std::min(info.image_width, info.image_height);
  info.scale_denom = 8;
  info.scale_num = 8;
  while (info.scale_num > 1 && (shorter * (info.scale_num - 1) + 7) / 8 >= min_side) --info.scale_num;
  jpeg_start_decompress(&info);
  image->height = info.output_height;
  image->width = info.output_width;
  image->pixels.resize(static_cast<std::size_t>(image->height * image->width * 3));
  row->resize(static_cast<std::size_t>(info.output_width) * info.output_components);
  while (info.output_scanline < info.output_height) {
    std::uint8_t* target = image->pixels.data() + std::int64_t{info.output_scanline} * image->width * 3;
    JSAMPROW rows[1] = {cmyk ? row->data() : target};
    jpeg_read_scanlines(&info, rows, 1);
    if (cmyk) cmyk_to_rgb(row->data(), image->width, info.saw_Adobe_marker, target);
  }
  jpeg_finish_decompress(&info);
  jpeg_destroy_decompress(&info);
  return true;
}

bool encode(FILE* file, const RgbImage& image, int quality, ErrorManager* manager) {
  jpeg_compress_struct info;
  info.err = jpeg_std_error(&manager->base);
  manager->base.error_exit = on_error;
  if (setjmp(manager->jump)) {
    jpeg_destroy_compress(&info);
    return false;
  }
  jpeg_create_compress(&info);
  jpeg_stdio_dest(&info, file);
  info.image_width = static_cast<JDIMENSION>(image.width);
  info.image_height = static_cast<JDIMENSION>(image.height);
  info.input_components = 3;
  info.in_color_space = JCS_RGB;
  jpeg_set_defaults(&info);
  jpeg_set_quality(&info, quality, TRUE);
  jpeg_start_compress(&info, TRUE);
  while (info.next_scanline < info.image_height) {
    JSAMPROW rows[1] = {const_cast<JSAMPLE*>(image.pixels.data() + std::int64_t{info.next_scanline} * image.width * 3)};
    jpeg_write_scanlines(&info, rows, 1);
  }
  jpeg_finish_compress(&info);
  jpeg_destroy_compress(&info);
  return true;
}

}  // namespace

RgbImage decode_jpeg(const std::string& path, std::int64_t min_side) {
  StdioFile file(path, "rb");
  ErrorManager manager{};
  RgbImage image;
  std::vector<JSAMPLE> row;
  if (!decode(file.get(), min_side, &manager, &image, &row)) {
    throw data::DataError(path + ": cannot decode JPEG: " + manager.message);
  }
  return image;
}

void encode_jpeg(const std::string& path, const RgbImage& image, int quality) {
  StdioFile file(path, "wb");
  ErrorManager manager{};
  if (!encode(file.get(), image, quality, &manager)) {
    throw data::DataError(path + ": cannot encode JPEG: " + manager.message);
  }
  file.close();
}

std::vector<std::uint8_t> resize_center_crop(const RgbImage& image, std::int64_t size) {
  const double scale = static_cast<double>(size) / std::min(image.height, image.width);
  const std::int64_t height = std::max(size, static_cast<std::int64_t>(std::lround(image.height * scale)));
  const std::int64_t width = std::max(size, static_cast<std::int64_t>(std::lround(image.width * scale)));
  const at::Tensor source =
      at::from_blob(const_cast<std::uint8_t*>(image.pixels.data()), {1, image.height, image.width, 3}, at::kByte);
  at::Tensor resized = at::upsample_bilinear2d(source.permute({0, 3, 1, 2}).to(at::kFloat),
                                               std::vector<std::int64_t>{height, width}, /*align_corners=*/false);
  resized = resized.narrow(2, (height - size) / 2, size).narrow(3, (width - size) / 2, size);
  const at::Tensor pixels = resized.round().clamp(0, 255).to(at::kByte).permute({0, 2, 3, 1}).contiguous();
  return {pixels.data_ptr<std::uint8_t>(), pixels.data_ptr<std::uint8_t>() + pixels.numel()};
}

}  // namespace tools
