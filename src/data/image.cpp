// Channel conversion, resize, crop and the shared evaluation preprocessing on 8-bit HWC images.
// Per-pixel work is plain loops (the loader calls this thousands of times a second), resizing included (PIL's).
#include "data/image.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <torch/torch.h>

namespace vit {

RawImage ImageInput::decode() && {
  if (!codec) return std::move(image);
  RawImage decoded = codec->decode(bytes, name);
  check_image(decoded, name);
  return decoded;
}

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

namespace {

// PIL's resampling (Image.resize without reducing_gap, as torchvision and Hugging Face call it), reproduced
// operation for operation so that 8-bit results equal PIL's: separable filters widened by the scale when shrinking,
// weights normalised in double then stored in 22-bit fixed point, a horizontal pass rounded to 8 bits, then a
// vertical one. Doing both passes in float and rounding once (torch's antialiased interpolate) differs from PIL by
// one level on some pixels.
constexpr int kPrecisionBits = 32 - 8 - 2;

double filter_weight(Interpolation interpolation, double x) {
  x = std::abs(x);
  if (interpolation == Interpolation::bilinear) return x < 1.0 ? 1.0 - x : 0.0;
  constexpr double a = -0.5;  // PIL's bicubic
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

// For each output position: the first input index, the number of taps, and their fixed-point weights.
struct Taps {
  int64_t ksize = 0;
  std::vector<int64_t> first, count;
  std::vector<int32_t> weights;  // (out_size, ksize)
};

Taps precompute_taps(int64_t in_size, int64_t out_size, Interpolation interpolation) {
  const double support_base = interpolation == Interpolation::bilinear ? 1.0 : 2.0;
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = support_base * filterscale;
  Taps taps;
  taps.ksize = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  taps.first.resize(out_size), taps.count.resize(out_size);
  taps.weights.assign(out_size * taps.ksize, 0);
  std::vector<double> k(taps.ksize);
  for (int64_t xx = 0; xx < out_size; ++xx) {
    const double center = (static_cast<double>(xx) + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int64_t xmin = static_cast<int>(center - support + 0.5);  // C's truncation, as PIL
    if (xmin < 0) xmin = 0;
    int64_t xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int64_t x = 0; x < xmax; ++x) {
      const double w = filter_weight(interpolation, (static_cast<double>(x + xmin) - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    for (int64_t x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? k[x] / ww : k[x];
      const double fixed = v * static_cast<double>(1 << kPrecisionBits);
      taps.weights[xx * taps.ksize + x] = static_cast<int32_t>(v < 0 ? -0.5 + fixed : 0.5 + fixed);
    }
    taps.first[xx] = xmin, taps.count[xx] = xmax;
  }
  return taps;
}

inline uint8_t clip8(int32_t v) {
  v >>= kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

// The passes accumulate in 32 bits as PIL does (22-bit weights times 8-bit pixels fit). Both are built for AVX2 too,
// picked at run time. The vertical pass runs along whole rows with one weight per input row, which vectorises.

// Horizontal pass. Along a row every output pixel has its own taps, which does not vectorise; across rows it does:
// the rows go through in blocks of kRowBlock, copied into a buffer that holds each input pixel's channel values for
// the block's rows side by side (widened to 32 bits, which the taps' products need), and each tap then adds one vector,
// a lane per row. The sums are integers, so their order cannot change a byte.
constexpr int64_t kRowBlock = 8;
typedef int32_t RowSums __attribute__((vector_size(kRowBlock * sizeof(int32_t))));

// Rows [0, rows) of `in` (in_width x C bytes each) to out_width x C.
__attribute__((target_clones("avx2", "default")))
void resize_rows(const uint8_t* in, int64_t in_width, uint8_t* out, int64_t out_width, int64_t rows, int64_t C,
                 const Taps& taps) {
  const int64_t R = kRowBlock, row_bytes = in_width * C;
  std::vector<int32_t> block(row_bytes * R);  // value i of the block's row r at [i * R + r]
  for (int64_t y0 = 0; y0 < rows; y0 += R) {
    const int64_t n = std::min(R, rows - y0);  // the last block's other lanes hold stale rows and are not written
    const uint8_t* first_row = in + y0 * row_bytes;
    for (int64_t i = 0; i < row_bytes; ++i) {
      for (int64_t r = 0; r < n; ++r) block[i * R + r] = first_row[r * row_bytes + i];
    }
    for (int64_t xx = 0; xx < out_width; ++xx) {
      const int32_t* k = taps.weights.data() + xx * taps.ksize;
      const int64_t count = taps.count[xx];
      for (int64_t c = 0; c < C; ++c) {
        const int32_t* src = block.data() + (taps.first[xx] * C + c) * R;
        RowSums sums = RowSums{} + (1 << (kPrecisionBits - 1));
        for (int64_t x = 0; x < count; ++x) {
          RowSums values;
          std::memcpy(&values, src + x * C * R, sizeof values);
          sums += values * k[x];
        }
        RowSums v = sums >> kPrecisionBits;  // clip8 on whole vectors
        v = v < 0 ? 0 : v;
        v = v > 255 ? 255 : v;
        uint8_t* dst = out + (y0 * out_width + xx) * C + c;
        for (int64_t r = 0; r < n; ++r) dst[r * out_width * C] = static_cast<uint8_t>(v[r]);
      }
    }
  }
}

// Vertical pass: `in` has rows of `stride` bytes starting at input row `row_offset`; `sums` holds `stride` values.
__attribute__((target_clones("avx2", "default")))
void resize_columns(const uint8_t* in, int64_t row_offset, uint8_t* out, int64_t out_height, int64_t stride,
                    const Taps& taps, int32_t* sums) {
  for (int64_t yy = 0; yy < out_height; ++yy) {
    const int32_t* k = taps.weights.data() + yy * taps.ksize;
    const uint8_t* src = in + (taps.first[yy] - row_offset) * stride;
    std::fill_n(sums, stride, 1 << (kPrecisionBits - 1));
    for (int64_t y = 0; y < taps.count[yy]; ++y) {
      const uint8_t* row = src + y * stride;
      const int32_t weight = k[y];
      for (int64_t i = 0; i < stride; ++i) sums[i] += row[i] * weight;
    }
    uint8_t* dst = out + yy * stride;
    for (int64_t i = 0; i < stride; ++i) dst[i] = clip8(sums[i]);
  }
}

}  // namespace

RawImage resize_image(const RawImage& image, int64_t height, int64_t width, Interpolation interpolation) {
  check_image(image, "resize_image");
  if (height <= 0 || width <= 0) {
    throw std::invalid_argument("resize_image: bad target size " + std::to_string(height) + "x" +
                                std::to_string(width));
  }
  const int64_t C = image.channels;
  const Taps vertical = precompute_taps(image.height, height, interpolation);
  // The horizontal pass covers only the rows the vertical pass reads, as PIL's.
  const int64_t row_first = vertical.first[0];
  const int64_t row_last = vertical.first[height - 1] + vertical.count[height - 1];

  RawImage across;  // the horizontal pass's rows [row_first, row_last), when the width changes
  if (width != image.width) {
    across = RawImage{row_last - row_first, width, C, {}};
    across.pixels.resize(across.height * width * C);
    resize_rows(image.pixels.data() + row_first * image.width * C, image.width, across.pixels.data(), width,
                across.height, C, precompute_taps(image.width, width, interpolation));
  }
  const bool resized_across = width != image.width;
  if (height == image.height) return resized_across ? across : image;

  RawImage out{height, width, C, {}};
  out.pixels.resize(height * width * C);
  std::vector<int32_t> sums(width * C);
  resize_columns(resized_across ? across.pixels.data() : image.pixels.data(), resized_across ? row_first : 0,
                 out.pixels.data(), height, width * C, vertical, sums.data());
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

int64_t centre_crop_offset(int64_t size, int64_t crop, CropOffset offset) {
  const int64_t difference = size - crop;
  const int64_t half = difference / 2;
  if (offset == CropOffset::floor) return half;  // the margin is never negative: the resize covers the crop
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
  const auto scale = eval_scale(height, p.crop_pct);
  const auto scale_w = eval_scale(width, p.crop_pct);
  if (p.crop_mode == CropMode::squash) return {scale, scale_w};
  if (height != width) {
    // timm's ResizeKeepRatio(longest=0): the side that needs the least shrinking fits, the other keeps the aspect
    // ratio; Python's round (ties to even).
    const double ratio = std::min(static_cast<double>(image_h) / static_cast<double>(scale),
                                  static_cast<double>(image_w) / static_cast<double>(scale_w));
    return {static_cast<int64_t>(std::nearbyint(static_cast<double>(image_h) / ratio)),
            static_cast<int64_t>(std::nearbyint(static_cast<double>(image_w) / ratio))};
  }
  // torchvision Resize(int): the shorter side becomes `scale`, the longer one int(scale * long / short).
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
  const int64_t top = centre_crop_offset(current->height, height, p.crop_offset);
  const int64_t left = centre_crop_offset(current->width, width, p.crop_offset);

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
