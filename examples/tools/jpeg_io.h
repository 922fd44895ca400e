#pragma once

// JPEG files through libjpeg(-turbo), and the resize that convert_imagefolder
// applies: what turns an ImageFolder tree into image shards.

#include <cstdint>
#include <string>
#include <vector>

namespace tools {

struct RgbImage {
  std::int64_t height = 0;
  std::int64_t width = 0;
  std::vector<std::uint8_t> pixels;  // height * width * 3, HWC
};

/// Decodes a JPEG file (RGB, grayscale or CMYK) to RGB. libjpeg may shrink it
/// by 1/8 steps while keeping the shorter side >= min_side: scaling inside the
/// DCT is cheaper than decoding everything, and it keeps the later bilinear
/// resize within a factor of two, where bilinear does not alias.
/// Throws data::DataError naming the file.
RgbImage decode_jpeg(const std::string& path, std::int64_t min_side);

/// Writes `image` as a baseline JPEG. Throws data::DataError naming the file.
void encode_jpeg(const std::string& path, const RgbImage& image, int quality);

/// The shorter side scaled to `size` (bilinear), then the central size x size
/// square: size * size * 3 bytes, HWC.
std::vector<std::uint8_t> resize_center_crop(const RgbImage& image, std::int64_t size);

}  // namespace tools
