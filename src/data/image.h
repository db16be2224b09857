// 8-bit images as the data pipeline sees them (HWC, RGB order) and the one evaluation preprocessing shared by
// predict, evaluate, export-attention and training's evaluation. Core library: torch + std only, no OpenCV.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "config/config.h"

namespace vit {

// Decoded pixels: HWC, RGB(A) order, 8 bits per channel; pixels.size() == height * width * channels.
struct RawImage {
  int64_t height = 0, width = 0, channels = 0;
  std::vector<uint8_t> pixels;
};

// An image file's size and channels as its header states them.
struct ImageSize {
  int64_t height = 0, width = 0, channels = 0;
};

// What an image file may cost before it is decoded: both limits are checked on the file's size and its header,
// without decoding, so a decompression bomb or a huge file fails at once. The defaults hold every real photo.
// (OpenCV refuses over 2^30 pixels whatever these say.)
struct ImageLimits {
  int64_t max_file_bytes = int64_t{1} << 30;  // 1 GiB: larger files are refused unread
  int64_t max_pixels = 178956970;             // width x height from the header: PIL's DecompressionBombError limit
};

// A rectangle of an image, in its pixels: rows [top, top + height), columns [left, left + width).
struct ImageWindow {
  int64_t top = 0, left = 0, height = 0, width = 0;
};

// Turns encoded image files into pixels; injected into the data pipeline, which has no codecs of its own (the core
// library builds without OpenCV). Every function is thread-safe and throws one line starting with `name`.
struct ImageCodec {
  // The whole image at full size.
  std::function<RawImage(const std::string& bytes, const std::string& name)> decode;
  // Optional, for training crops: the header's size where decode_window applies to the file (else nullopt), and
  // the window decoded at 1/scale (scale 1, 2, 4 or 8): the result is the window's pixels in the image scaled by
  // 1/scale, rows [floor(top/scale), ceil((top+height)/scale)) and the same for columns, as if the scaled image
  // had been decoded whole and cropped.
  std::function<std::optional<ImageSize>(const std::string& bytes)> peek;
  std::function<RawImage(const std::string& bytes, const std::string& name, const ImageWindow& window, int scale)>
      decode_window;
};

// An image as a sample transform receives it: decoded pixels, or an encoded file with the codec that decodes it, so
// that a training crop can decode only the part it keeps. Evaluation transforms call decode().
struct ImageInput {
  RawImage image;                            // the pixels, unless `bytes` holds an encoded file
  std::string bytes;                         // encoded file (empty: `image` is already decoded)
  std::string name;                          // names the file in errors
  std::shared_ptr<const ImageCodec> codec;   // decodes `bytes`

  ImageInput() = default;
  ImageInput(RawImage decoded) : image(std::move(decoded)) {}  // NOLINT: implicit, a decoded image is an input
  ImageInput(std::string encoded, std::string file_name, std::shared_ptr<const ImageCodec> file_codec)
      : bytes(std::move(encoded)), name(std::move(file_name)), codec(std::move(file_codec)) {}

  bool encoded() const { return codec != nullptr; }
  // The whole image (decoding the file when encoded); moves the pixels out.
  RawImage decode() &&;
};

// Throws std::invalid_argument unless the sizes are positive and match the pixel count; `what` names the image.
void check_image(const RawImage& image, const std::string& what);

// Channel conversion to the model's: 1->3 replicates; 3/4->1 is PIL's "L" luminance (0.299R + 0.587G + 0.114B in
// PIL's 16-bit fixed point, rounded); 4->3 drops alpha; k->k is a copy. Other pairs throw naming both counts.
RawImage convert_channels(const RawImage& image, int64_t channels);

// Resizes exactly as PIL's Image.resize with BILINEAR or BICUBIC (antialiased, fixed-point, horizontal then vertical
// pass, each rounded to 8 bits): the results equal what timm's and Hugging Face's PIL pipelines compute.
RawImage resize_image(const RawImage& image, int64_t height, int64_t width, Interpolation interpolation);

// The window [top, top + height) x [left, left + width); throws when it is not inside the image.
RawImage crop_image(const RawImage& image, int64_t top, int64_t left, int64_t height, int64_t width);

// Offset of a centred crop of `crop` out of `size`: rounded like torchvision's center_crop (Python's round, ties to
// even), so crops match timm's pixel for pixel, or with CropOffset::floor as transformers' processors crop.
int64_t centre_crop_offset(int64_t size, int64_t crop, CropOffset offset = CropOffset::round);


// The evaluation geometry, the one place it is computed (preprocess() and export-attention's crop window use it):
// the size an image_h x image_w image is resized to before the centre crop to height x width.
// As timm's eval transform: crop_mode center with a square target: the shorter side becomes floor(size / crop_pct)
// and the other keeps the aspect ratio (torchvision Resize(int); at crop_pct 1 the centre crop then takes the middle
// square); crop_mode squash: (floor(H / crop_pct), floor(W / crop_pct)); crop_mode center with a rectangular target:
// the image scaled by one factor until both sides cover those sizes (timm's ResizeKeepRatio).
struct ResizeShape {
  int64_t height = 0, width = 0;
};
ResizeShape eval_resize_shape(int64_t image_h, int64_t image_w, const Preprocess& p, int64_t height, int64_t width);

// Normalisation (x / 255 - mean[c]) / std[c] for all 256 byte values of each channel, computed in float32 exactly as
// timm's ToTensor + Normalize do; normalising a pixel is then one table lookup.
class Normalizer {
 public:
  // mean/std may have 1 entry, `channels` entries, or any number of equal entries (broadcast: timm's default
  // (0.5, 0.5, 0.5) serves a grayscale model too); otherwise throws naming the counts.
  Normalizer(const Preprocess& preprocess, int64_t channels);
  int64_t channels() const { return channels_; }
  const float* table(int64_t channel) const { return table_.data() + channel * 256; }

 private:
  int64_t channels_;
  std::vector<float> table_;  // (channels, 256)
};

// THE evaluation preprocessing: convert channels, resize, centre crop, x/255, (x - mean[c]) / std[c].
// The resize is eval_resize_shape()'s, skipped when the size already matches; then the centre crop.
// Returns float32 (C, H, W), contiguous.
torch::Tensor preprocess(const RawImage& image, const Preprocess& p, int64_t height, int64_t width, int64_t channels);
// The same with a prebuilt Normalizer (channels = normalizer.channels()), for callers preprocessing many images.
torch::Tensor preprocess(const RawImage& image, const Preprocess& p, const Normalizer& normalizer, int64_t height,
                         int64_t width);

}  // namespace vit
