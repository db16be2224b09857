// RandAugment ops following timm's auto_augment.py (PIL semantics for the colour ops: ImageOps and ImageEnhance),
// on a cv::Mat header over the RawImage's own pixels; geometric ops warp into a temporary and copy back.
#include "image/randaugment.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

namespace vit {
namespace {

constexpr double kLevelDenominator = 10.0;  // timm's _LEVEL_DENOM
constexpr int kFill = 128;                  // timm's default fill colour for geometric ops

uint8_t clamp_byte(double value) { return static_cast<uint8_t>(std::clamp(std::lround(value), 0l, 255l)); }

cv::Mat mat_over(RawImage& image) {
  return cv::Mat(static_cast<int>(image.height), static_cast<int>(image.width),
                 CV_8UC(static_cast<int>(image.channels)), image.pixels.data());
}

// dst = M * src coordinates (inverse map: output pixel -> input position), grey outside.
void warp(RawImage& image, const cv::Matx23d& inverse_map) {
  cv::Mat source = mat_over(image);
  cv::Mat warped;
  cv::warpAffine(source, warped, cv::Mat(inverse_map), source.size(), cv::INTER_LINEAR | cv::WARP_INVERSE_MAP,
                 cv::BORDER_CONSTANT, cv::Scalar::all(kFill));
  warped.copyTo(source);  // same size and type: writes into the RawImage's pixels
}

void apply_lut(RawImage& image, const std::vector<std::array<uint8_t, 256>>& luts) {
  const int64_t C = image.channels;
  for (size_t i = 0; i < image.pixels.size(); ++i) image.pixels[i] = luts[i % C][image.pixels[i]];
}

std::array<std::array<int64_t, 256>, 3> histograms(const RawImage& image) {
  std::array<std::array<int64_t, 256>, 3> counts{};
  const int64_t C = image.channels;
  for (size_t i = 0; i < image.pixels.size(); ++i) ++counts[i % C][image.pixels[i]];
  return counts;
}

// PIL ImageOps.autocontrast (cutoff 0): each channel stretched to the full range.
void auto_contrast(RawImage& image) {
  const auto counts = histograms(image);
  std::vector<std::array<uint8_t, 256>> luts(image.channels);
  for (int64_t c = 0; c < image.channels; ++c) {
    int low = 0, high = 255;
    while (low < 256 && counts[c][low] == 0) ++low;
    while (high >= 0 && counts[c][high] == 0) --high;
    for (int v = 0; v < 256; ++v) luts[c][v] = static_cast<uint8_t>(v);
    if (high <= low) continue;
    const double scale = 255.0 / (high - low), offset = -low * scale;
    for (int v = 0; v < 256; ++v) {
      luts[c][v] = static_cast<uint8_t>(std::clamp(static_cast<int>(v * scale + offset), 0, 255));
    }
  }
  apply_lut(image, luts);
}

// PIL ImageOps.equalize, per channel.
void equalize(RawImage& image) {
  const auto counts = histograms(image);
  std::vector<std::array<uint8_t, 256>> luts(image.channels);
  for (int64_t c = 0; c < image.channels; ++c) {
    for (int v = 0; v < 256; ++v) luts[c][v] = static_cast<uint8_t>(v);
    int64_t total = 0, last = 0, used = 0;
    for (int v = 0; v < 256; ++v) {
      if (counts[c][v] == 0) continue;
      total += counts[c][v];
      last = counts[c][v];
      ++used;
    }
    if (used <= 1) continue;
    const int64_t step = (total - last) / 255;
    if (step == 0) continue;
    int64_t n = step / 2;
    for (int v = 0; v < 256; ++v) {
      luts[c][v] = static_cast<uint8_t>(std::min<int64_t>(n / step, 255));
      n += counts[c][v];
    }
  }
  apply_lut(image, luts);
}

void point_op(RawImage& image, uint8_t (*op)(uint8_t, int), int parameter) {
  std::vector<std::array<uint8_t, 256>> luts(image.channels);
  for (auto& lut : luts) {
    for (int v = 0; v < 256; ++v) lut[v] = op(static_cast<uint8_t>(v), parameter);
  }
  apply_lut(image, luts);
}

// PIL Image.blend(degenerate, image, factor): degenerate + factor * (image - degenerate), clipped.
void blend_with(RawImage& image, const std::vector<uint8_t>& degenerate, double factor) {
  for (size_t i = 0; i < image.pixels.size(); ++i) {
    const double base = degenerate[i];
    image.pixels[i] = clamp_byte(base + factor * (image.pixels[i] - base));
  }
}

// PIL's "L" luminance of pixel i (fixed point, as convert_channels).
uint8_t luminance(const RawImage& image, int64_t i) {
  const uint8_t* p = image.pixels.data() + i * image.channels;
  if (image.channels == 1) return p[0];
  return static_cast<uint8_t>((p[0] * 19595u + p[1] * 38470u + p[2] * 7471u + 0x8000u) >> 16);
}

void color(RawImage& image, double factor) {
  if (image.channels == 1) return;  // a grey image is its own degenerate
  std::vector<uint8_t> degenerate(image.pixels.size());
  const int64_t count = image.height * image.width;
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t grey = luminance(image, i);
    for (int64_t c = 0; c < image.channels; ++c) degenerate[i * image.channels + c] = grey;
  }
  blend_with(image, degenerate, factor);
}

void contrast(RawImage& image, double factor) {
  const int64_t count = image.height * image.width;
  double sum = 0;
  for (int64_t i = 0; i < count; ++i) sum += luminance(image, i);
  const auto mean = static_cast<uint8_t>(std::clamp(static_cast<int>(sum / count + 0.5), 0, 255));
  blend_with(image, std::vector<uint8_t>(image.pixels.size(), mean), factor);
}

void brightness(RawImage& image, double factor) {
  blend_with(image, std::vector<uint8_t>(image.pixels.size(), 0), factor);
}

// PIL ImageEnhance.Sharpness: blend with the SMOOTH filter ([1 1 1; 1 5 1; 1 1 1] / 13), border pixels unfiltered.
void sharpness(RawImage& image, double factor) {
  const int64_t H = image.height, W = image.width, C = image.channels;
  std::vector<uint8_t> smooth = image.pixels;
  for (int64_t y = 1; y + 1 < H; ++y) {
    for (int64_t x = 1; x + 1 < W; ++x) {
      for (int64_t c = 0; c < C; ++c) {
        int sum = 0;
        for (int64_t dy = -1; dy <= 1; ++dy) {
          for (int64_t dx = -1; dx <= 1; ++dx) sum += image.pixels[((y + dy) * W + x + dx) * C + c];
        }
        sum += 4 * image.pixels[(y * W + x) * C + c];  // centre weight 5
        smooth[(y * W + x) * C + c] = clamp_byte(sum / 13.0);
      }
    }
  }
  blend_with(image, smooth, factor);
}

uint8_t solarize_value(uint8_t v, int threshold) { return v < threshold ? v : static_cast<uint8_t>(255 - v); }
uint8_t posterize_value(uint8_t v, int bits) {
  return static_cast<uint8_t>(v & static_cast<uint8_t>(~((1 << (8 - bits)) - 1)));
}

}  // namespace

const std::vector<std::string>& randaugment_op_names() {
  static const std::vector<std::string> names = {"Identity", "AutoContrast", "Equalize",   "Rotate",   "Solarize",
                                                 "Color",    "Posterize",    "Contrast",   "Brightness", "Sharpness",
                                                 "ShearX",   "ShearY",       "TranslateX", "TranslateY"};
  return names;
}

void apply_randaugment_op(RawImage& image, const std::string& name, double magnitude, bool negate) {
  check_image(image, "RandAugment");
  if (image.channels != 1 && image.channels != 3) {
    throw std::invalid_argument("RandAugment works on 1 or 3 channels, got " + std::to_string(image.channels));
  }
  const double level = std::clamp(magnitude, 0.0, 30.0) / kLevelDenominator;
  const double sign = negate ? -1.0 : 1.0;
  const double enhance = level * 1.8 + 0.1;  // timm _enhance_level_to_arg: factor in [0.1, 1.9] at levels 0..10
  const double H = static_cast<double>(image.height), W = static_cast<double>(image.width);
  if (name == "Identity") {
    return;
  } else if (name == "AutoContrast") {
    auto_contrast(image);
  } else if (name == "Equalize") {
    equalize(image);
  } else if (name == "Rotate") {
    // PIL rotates counter-clockwise about the centre, as getRotationMatrix2D does for a positive angle.
    const cv::Mat forward = cv::getRotationMatrix2D(cv::Point2f(static_cast<float>((W - 1) / 2),
                                                                static_cast<float>((H - 1) / 2)),
                                                    sign * level * 30.0, 1.0);
    cv::Mat inverse;
    cv::invertAffineTransform(forward, inverse);
    warp(image, cv::Matx23d(inverse));
  } else if (name == "Solarize") {
    point_op(image, solarize_value, std::clamp(static_cast<int>(level * 256), 0, 256));
  } else if (name == "Color") {
    color(image, enhance);
  } else if (name == "Posterize") {
    const int bits = std::clamp(static_cast<int>(level * 4), 0, 8);
    if (bits < 8) point_op(image, posterize_value, bits);
  } else if (name == "Contrast") {
    contrast(image, enhance);
  } else if (name == "Brightness") {
    brightness(image, enhance);
  } else if (name == "Sharpness") {
    sharpness(image, enhance);
  } else if (name == "ShearX") {
    // PIL's affine samples at pixel centres: x_in = x + s * (y + 0.5).
    const double s = sign * level * 0.3;
    warp(image, cv::Matx23d(1, s, 0.5 * s, 0, 1, 0));
  } else if (name == "ShearY") {
    const double s = sign * level * 0.3;
    warp(image, cv::Matx23d(1, 0, 0, s, 1, 0.5 * s));
  } else if (name == "TranslateX") {
    warp(image, cv::Matx23d(1, 0, sign * level * 0.45 * W, 0, 1, 0));
  } else if (name == "TranslateY") {
    warp(image, cv::Matx23d(1, 0, 0, 0, 1, sign * level * 0.45 * H));
  } else {
    std::string known;
    for (const std::string& op : randaugment_op_names()) known += (known.empty() ? "" : ", ") + op;
    throw std::invalid_argument("unknown RandAugment op \"" + name + "\" (known: " + known + ")");
  }
}

RawAugment make_randaugment(int64_t num_ops, double magnitude) {
  if (num_ops < 0) throw std::invalid_argument("RandAugment: num_ops " + std::to_string(num_ops) + " is negative");
  if (!(magnitude >= 0.0 && magnitude <= 30.0)) {
    throw std::invalid_argument("RandAugment: magnitude " + std::to_string(magnitude) + " is outside [0, 30]");
  }
  return [num_ops, magnitude](RawImage& image, std::mt19937_64& rng) {
    const std::vector<std::string>& ops = randaugment_op_names();
    for (int64_t i = 0; i < num_ops; ++i) {
      // timm AugmentOp: pick with replacement, apply with probability 0.5, negate signed ops with probability 0.5.
      const std::string& op = ops[uniform_int(rng, static_cast<int64_t>(ops.size()))];
      if (uniform01(rng) >= 0.5) continue;
      const bool negate = uniform01(rng) < 0.5;
      apply_randaugment_op(image, op, magnitude, negate);
    }
  };
}

}  // namespace vit
