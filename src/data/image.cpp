// Channel conversion, resize, crop and the shared evaluation preprocessing on 8-bit HWC images.
// Per-pixel work is plain loops (the loader calls this thousands of times a second); torch only resizes.
#include "data/image.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <torch/torch.h>

namespace vit {

void check_image(const RawImage& image, const std::string& what) {
  if (image.height <= 0 || image.width <= 0 || image.channels <= 0) {
    throw std::invalid_argument(what + ": empty image (" + std::to_string(image.height) + "x" +
                                std::to_string(image.width) + "x" + std::to_string(image.channels) + ")");
  }
  const int64_t expected = image.height * image.width * image.channels;
  if (static_cast<int64_t>(image.pixels.size()) != expected) {
    throw std::invalid_argument(what + ": " + std::to_string(image.pixels.size()) + " bytes of pixels for a " +
                                std::to_string(image.height) + "x" + std::to_string(image.width) + "x" +
                                std::to_string(image.channels) + " image (expected " + std::to_string(expected) +
                                ")");
  }
}

RawImage convert_channels(const RawImage& image, int64_t channels) {
  check_image(image, "convert_channels");
  const int64_t from = image.channels;
  if (from == channels) return image;
  RawImage out{image.height, image.width, channels, {}};
  const int64_t count = image.height * image.width;
  out.pixels.resize(count * channels);
  const uint8_t* src = image.pixels.data();
  uint8_t* dst = out.pixels.data();
  if (from == 1 && channels == 3) {
    for (int64_t i = 0; i < count; ++i) dst[3 * i] = dst[3 * i + 1] = dst[3 * i + 2] = src[i];
  } else if ((from == 3 || from == 4) && channels == 1) {
    // PIL's L24 macro: the same weights in 16-bit fixed point, rounded, so grayscale inputs match timm exactly.
    for (int64_t i = 0; i < count; ++i) {
      const uint8_t* p = src + from * i;
      dst[i] = static_cast<uint8_t>((p[0] * 19595u + p[1] * 38470u + p[2] * 7471u + 0x8000u) >> 16);
    }
  } else if (from == 4 && channels == 3) {
    for (int64_t i = 0; i < count; ++i) std::memcpy(dst + 3 * i, src + 4 * i, 3);
  } else {
    throw std::invalid_argument("cannot convert an image with " + std::to_string(from) + " channels to " +
                                std::to_string(channels) + " channels (supported: 1->3, 3->1, 4->1, 4->3)");
  }
  return out;
}

RawImage resize_image(const RawImage& image, int64_t height, int64_t width, Interpolation interpolation) {
  namespace F = torch::nn::functional;
  check_image(image, "resize_image");
  if (height <= 0 || width <= 0) {
    throw std::invalid_argument("resize_image: bad target size " + std::to_string(height) + "x" +
                                std::to_string(width));
  }
  F::InterpolateFuncOptions options;
  if (interpolation == Interpolation::bilinear) {
    options.mode(torch::kBilinear);
  } else {
    options.mode(torch::kBicubic);
  }
  // Antialiasing in both directions: the _aa kernels are PIL's (bicubic a = -0.5, filter widened by the scale when
  // shrinking), which is what timm's PIL pipeline computes; torch's plain bicubic (a = -0.75) would not match.
  options.size(std::vector<int64_t>{height, width}).align_corners(false).antialias(true);

  const int64_t C = image.channels;
  const torch::Tensor hwc = torch::from_blob(const_cast<uint8_t*>(image.pixels.data()),
                                             {image.height, image.width, C}, torch::kUInt8);
  const torch::Tensor input = hwc.permute({2, 0, 1}).unsqueeze(0).to(torch::kFloat32);  // (1, C, H, W)
  torch::Tensor resized = F::interpolate(input, options);                                // (1, C, h, w)
  // PIL rounds to nearest when storing 8-bit results.
  resized = resized.clamp(0, 255).round().to(torch::kUInt8).squeeze(0).permute({1, 2, 0}).contiguous();  // (h, w, C)

  RawImage out{height, width, C, {}};
  out.pixels.resize(height * width * C);
  std::memcpy(out.pixels.data(), resized.data_ptr<uint8_t>(), out.pixels.size());
  return out;
}

RawImage crop_image(const RawImage& image, int64_t top, int64_t left, int64_t height, int64_t width) {
  check_image(image, "crop_image");
  if (top < 0 || left < 0 || height <= 0 || width <= 0 || top + height > image.height ||
      left + width > image.width) {
    throw std::invalid_argument("crop_image: window " + std::to_string(height) + "x" + std::to_string(width) +
                                " at (" + std::to_string(top) + ", " + std::to_string(left) + ") is outside the " +
                                std::to_string(image.height) + "x" + std::to_string(image.width) + " image");
  }
  const int64_t C = image.channels;
  RawImage out{height, width, C, {}};
  out.pixels.resize(height * width * C);
  for (int64_t y = 0; y < height; ++y) {
    std::memcpy(out.pixels.data() + y * width * C, image.pixels.data() + ((top + y) * image.width + left) * C,
                width * C);
  }
  return out;
}

int64_t centre_crop_offset(int64_t size, int64_t crop) {
  const int64_t difference = size - crop;
  const int64_t half = difference / 2;
  // round(difference / 2.0) with ties to even, as Python rounds.
  if (difference % 2 == 0) return half;
  return half % 2 == 0 ? half : half + 1;
}

Normalizer::Normalizer(const Preprocess& preprocess, int64_t channels) : channels_(channels) {
  const auto per_channel = [&](const std::vector<double>& values, const char* name) {
    // Equal entries are channel-agnostic: timm's default (0.5, 0.5, 0.5) also serves a grayscale model.
    const bool uniform = !values.empty() && std::all_of(values.begin(), values.end(),
                                                        [&](double v) { return v == values[0]; });
    if (!uniform && static_cast<int64_t>(values.size()) != channels) {
      throw std::invalid_argument(std::string("preprocess ") + name + " has " + std::to_string(values.size()) +
                                  " entries; expected 1 or " + std::to_string(channels) +
                                  " (the model's channels), or all equal");
    }
    return [&values, uniform](int64_t c) { return static_cast<float>(uniform ? values[0] : values[c]); };
  };
  const auto mean = per_channel(preprocess.mean, "mean");
  const auto deviation = per_channel(preprocess.std, "std");
  table_.resize(channels * 256);
  for (int64_t c = 0; c < channels; ++c) {
    const float m = mean(c), s = deviation(c);
    if (!(s != 0.0f)) throw std::invalid_argument("preprocess std[" + std::to_string(c) + "] is 0");
    // The same float32 operations, in the same order, as ToTensor's div(255) then Normalize's sub(mean).div(std).
    for (int v = 0; v < 256; ++v) table_[c * 256 + v] = (static_cast<float>(v) / 255.0f - m) / s;
  }
}

ResizeShape eval_resize_shape(int64_t image_h, int64_t image_w, const Preprocess& p, int64_t height, int64_t width) {
  if (p.crop_pct >= 1.0) return {height, width};
  if (height != width) {
    return {static_cast<int64_t>(std::floor(static_cast<double>(height) / p.crop_pct)),
            static_cast<int64_t>(std::floor(static_cast<double>(width) / p.crop_pct))};
  }
  // torchvision Resize(int): the shorter side becomes `scale`, the longer one int(scale * long / short).
  const auto scale = static_cast<int64_t>(std::floor(static_cast<double>(height) / p.crop_pct));
  const auto longer = [&](int64_t a, int64_t b) {
    return static_cast<int64_t>(static_cast<double>(scale) * static_cast<double>(a) / static_cast<double>(b));
  };
  if (image_w <= image_h) return {longer(image_h, image_w), scale};
  return {scale, longer(image_w, image_h)};
}

torch::Tensor preprocess(const RawImage& image, const Preprocess& p, int64_t height, int64_t width, int64_t channels) {
  return preprocess(image, p, Normalizer(p, channels), height, width);
}

torch::Tensor preprocess(const RawImage& image, const Preprocess& p, const Normalizer& normalizer, int64_t height,
                         int64_t width) {
  check_image(image, "preprocess");
  const int64_t channels = normalizer.channels();
  if (height <= 0 || width <= 0) {
    throw std::invalid_argument("preprocess: bad target size " + std::to_string(height) + "x" +
                                std::to_string(width));
  }
  if (!(p.crop_pct > 0.0 && p.crop_pct <= 1.0)) {
    throw std::invalid_argument("preprocess: crop_pct " + std::to_string(p.crop_pct) + " is outside (0, 1]");
  }
  // Work on the caller's pixels until a conversion or resize needs a copy: most inputs need neither.
  RawImage storage;
  const RawImage* current = &image;
  if (image.channels != channels) {
    storage = convert_channels(image, channels);
    current = &storage;
  }

  const auto [resize_h, resize_w] = eval_resize_shape(current->height, current->width, p, height, width);
  if (resize_h != current->height || resize_w != current->width) {
    storage = resize_image(*current, resize_h, resize_w, p.interpolation);
    current = &storage;
  }
  const int64_t top = centre_crop_offset(current->height, height);
  const int64_t left = centre_crop_offset(current->width, width);

  torch::Tensor out = torch::empty({channels, height, width}, torch::kFloat32);  // (C, H, W)
  float* dst = out.data_ptr<float>();
  const int64_t W = current->width;
  for (int64_t c = 0; c < channels; ++c) {
    const float* table = normalizer.table(c);
    for (int64_t y = 0; y < height; ++y) {
      const uint8_t* row = current->pixels.data() + ((top + y) * W + left) * channels + c;
      float* out_row = dst + (c * height + y) * width;
      for (int64_t x = 0; x < width; ++x) out_row[x] = table[row[x * channels]];
    }
  }
  return out;
}

}  // namespace vit
