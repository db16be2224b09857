// Training augmentation and mixup/cutmix. Per-sample work is plain loops over bytes (the default job pushes
// thousands of 28x28 images a second through this on two cores); torch is only called for a real resize.
#include "data/augment.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <stdexcept>

#include <torch/torch.h>

namespace vit {
namespace {

constexpr double kPi = 3.14159265358979323846;

// Fills `count` values with N(0, 1) noise, two per Box-Muller draw.
void fill_normal(float* out, int64_t count, std::mt19937_64& rng) {
  for (int64_t i = 0; i < count; i += 2) {
    const double radius = std::sqrt(-2.0 * std::log(1.0 - uniform01(rng)));  // 1 - u is in (0, 1]
    const double angle = 2.0 * kPi * uniform01(rng);
    out[i] = static_cast<float>(radius * std::cos(angle));
    if (i + 1 < count) out[i + 1] = static_cast<float>(radius * std::sin(angle));
  }
}

struct Window {
  int64_t top = 0, left = 0, height = 0, width = 0;
};

// torchvision RandomResizedCrop.get_params: 10 tries at a random area/ratio, then a centre crop clamped to the
// ratio range. Python's round() is ties-to-even, as std::nearbyint in the default rounding mode.
Window random_resized_crop_window(std::mt19937_64& rng, int64_t height, int64_t width,
                                  const std::array<double, 2>& scale, const std::array<double, 2>& ratio) {
  const double area = static_cast<double>(height * width);
  const double log_ratio_low = std::log(ratio[0]), log_ratio_high = std::log(ratio[1]);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * (scale[0] + (scale[1] - scale[0]) * uniform01(rng));
    const double aspect = std::exp(log_ratio_low + (log_ratio_high - log_ratio_low) * uniform01(rng));
    const auto w = static_cast<int64_t>(std::nearbyint(std::sqrt(target_area * aspect)));
    const auto h = static_cast<int64_t>(std::nearbyint(std::sqrt(target_area / aspect)));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int64_t top = uniform_int(rng, height - h + 1);
      const int64_t left = uniform_int(rng, width - w + 1);
      return {top, left, h, w};
    }
  }
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  const double min_ratio = std::min(ratio[0], ratio[1]), max_ratio = std::max(ratio[0], ratio[1]);
  int64_t w = width, h = height;
  if (in_ratio < min_ratio) {
    h = static_cast<int64_t>(std::nearbyint(static_cast<double>(w) / min_ratio));
  } else if (in_ratio > max_ratio) {
    w = static_cast<int64_t>(std::nearbyint(static_cast<double>(h) * max_ratio));
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

// timm RandomErasing (mode "pixel", one box): area 2%..1/3 of the image, log aspect ratio in [log 0.3, log 1/0.3],
// 10 tries to fit, filled with per-pixel N(0, 1) noise on the normalised image.
void random_erase(float* chw, int64_t channels, int64_t height, int64_t width, std::mt19937_64& rng) {
  const double area = static_cast<double>(height * width);
  const double log_low = std::log(0.3), log_high = std::log(1.0 / 0.3);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * (0.02 + (1.0 / 3.0 - 0.02) * uniform01(rng));
    const double aspect = std::exp(log_low + (log_high - log_low) * uniform01(rng));
    const auto h = static_cast<int64_t>(std::nearbyint(std::sqrt(target_area * aspect)));
    const auto w = static_cast<int64_t>(std::nearbyint(std::sqrt(target_area / aspect)));
    if (w < width && h < height) {
      const int64_t top = uniform_int(rng, height - h + 1);
      const int64_t left = uniform_int(rng, width - w + 1);
      std::vector<float> noise(channels * h * w);  // (C, h, w)
      fill_normal(noise.data(), static_cast<int64_t>(noise.size()), rng);
      for (int64_t c = 0; c < channels; ++c) {
        for (int64_t y = 0; y < h; ++y) {
          std::copy_n(noise.data() + (c * h + y) * w, w, chw + (c * height + top + y) * width + left);
        }
      }
      return;
    }
  }
}

struct TrainPlan {
  int64_t height, width, channels;
  Interpolation interpolation;
  AugmentConfig augment;
  Normalizer normalizer;
  RawAugment raw_augment;
  bool reduced_decode;
};

}  // namespace

int reduced_decode_scale(int64_t crop_h, int64_t crop_w, int64_t out_h, int64_t out_w) {
  for (int scale : {8, 4, 2}) {
    if (crop_h >= scale * out_h && crop_w >= scale * out_w) return scale;
  }
  return 1;
}

namespace {

// The random resized crop of an encoded file, decoding only the crop's window at the largest DCT reduction that
// keeps it at or above the output size. Draws the same window as the decoded path (the same RNG calls, on the
// header's size). Empty when the codec cannot window this file.
std::optional<RawImage> decode_crop(const TrainPlan& plan, const ImageInput& input, std::mt19937_64& rng) {
  const ImageCodec& codec = *input.codec;
  if (!codec.peek || !codec.decode_window) return std::nullopt;
  const std::optional<ImageSize> size = codec.peek(input.bytes);
  if (!size) return std::nullopt;
  const AugmentConfig& augment = plan.augment;
  const Window window = random_resized_crop_window(rng, size->height, size->width, augment.scale, augment.ratio);
  const int scale = reduced_decode_scale(window.height, window.width, plan.height, plan.width);
  RawImage image =
      codec.decode_window(input.bytes, input.name, {window.top, window.left, window.height, window.width}, scale);
  check_image(image, input.name);
  return image;
}

torch::Tensor train_transform(const TrainPlan& plan, ImageInput input, std::mt19937_64& rng) {
  const int64_t H = plan.height, W = plan.width, C = plan.channels;
  const AugmentConfig& augment = plan.augment;
  const bool raw_augment = plan.raw_augment && augment.randaugment_ops > 0;
  // RandAugment works on the whole image before the crop, so it needs the whole image decoded.
  std::optional<RawImage> crop;
  if (plan.reduced_decode && augment.random_resized_crop && !raw_augment && input.encoded()) {
    crop = decode_crop(plan, input, rng);
  }
  RawImage image = crop ? std::move(*crop) : std::move(input).decode();
  check_image(image, "train transform");
  if (image.channels != C) image = convert_channels(image, C);
  if (raw_augment) plan.raw_augment(image, rng);

  // Geometry: afterwards output pixel (y, x) reads image pixel (y + offset_y, x + offset_x), zero outside.
  int64_t offset_y = 0, offset_x = 0;
  if (crop) {
    if (image.height != H || image.width != W) image = resize_image(image, H, W, plan.interpolation);
  } else if (augment.random_resized_crop) {
    const Window window = random_resized_crop_window(rng, image.height, image.width, augment.scale, augment.ratio);
    if (window.height == H && window.width == W) {
      offset_y = window.top;
      offset_x = window.left;
    } else {
      image = resize_image(crop_image(image, window.top, window.left, window.height, window.width), H, W,
                           plan.interpolation);
    }
  } else {
    if (image.height != H || image.width != W) image = resize_image(image, H, W, plan.interpolation);
    if (augment.pad_crop > 0) {
      const int64_t pad = augment.pad_crop;
      offset_y = uniform_int(rng, 2 * pad + 1) - pad;
      offset_x = uniform_int(rng, 2 * pad + 1) - pad;
    }
  }
  const bool flip = augment.hflip > 0 && uniform01(rng) < augment.hflip;

  torch::Tensor out = torch::empty({C, H, W}, torch::kFloat32);  // (C, H, W)
  float* dst = out.data_ptr<float>();
  const int64_t source_w = image.width, source_h = image.height;
  for (int64_t c = 0; c < C; ++c) {
    const float* table = plan.normalizer.table(c);
    const float zero = table[0];  // padding is black before normalisation, as torchvision pads with fill=0
    for (int64_t y = 0; y < H; ++y) {
      float* out_row = dst + (c * H + y) * W;
      const int64_t sy = y + offset_y;
      if (sy < 0 || sy >= source_h) {
        std::fill_n(out_row, W, zero);
        continue;
      }
      const uint8_t* row = image.pixels.data() + sy * source_w * C + c;
      for (int64_t x = 0; x < W; ++x) {
        const int64_t sx = (flip ? W - 1 - x : x) + offset_x;
        out_row[x] = (sx < 0 || sx >= source_w) ? zero : table[row[sx * C]];
      }
    }
  }
  if (augment.random_erasing > 0 && uniform01(rng) < augment.random_erasing) random_erase(dst, C, H, W, rng);
  return out;
}

}  // namespace

double sample_normal(std::mt19937_64& rng) {
  const double radius = std::sqrt(-2.0 * std::log(1.0 - uniform01(rng)));
  return radius * std::cos(2.0 * kPi * uniform01(rng));
}

double sample_gamma(std::mt19937_64& rng, double shape) {
  if (!(shape > 0)) throw std::invalid_argument("sample_gamma: shape " + std::to_string(shape) + " must be positive");
  if (shape < 1.0) {
    // Gamma(a) = Gamma(a + 1) * U^(1/a) (Marsaglia-Tsang's boost for a < 1).
    const double u = 1.0 - uniform01(rng);
    return sample_gamma(rng, shape + 1.0) * std::pow(u, 1.0 / shape);
  }
  const double d = shape - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x, v;
    do {
      x = sample_normal(rng);
      v = 1.0 + c * x;
    } while (v <= 0.0);
    v = v * v * v;
    const double u = 1.0 - uniform01(rng);
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
    if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
  }
}

double sample_beta(std::mt19937_64& rng, double a, double b) {
  const double x = sample_gamma(rng, a), y = sample_gamma(rng, b);
  // Tiny shapes can underflow both draws; Beta(a, b) then tends to Bernoulli(a / (a + b)).
  if (x + y == 0.0) return uniform01(rng) < a / (a + b) ? 1.0 : 0.0;
  return x / (x + y);
}

SampleTransform make_eval_transform(const DataConfig& data, const ModelConfig& model) {
  auto normalizer = std::make_shared<const Normalizer>(data.preprocess, model.in_chans);  // validates mean/std
  const Preprocess preprocess_config = data.preprocess;
  const int64_t height = model.img_h, width = model.img_w;
  return [normalizer, preprocess_config, height, width](ImageInput input, std::mt19937_64&) {
    return preprocess(std::move(input).decode(), preprocess_config, *normalizer, height, width);
  };
}

SampleTransform make_train_transform(const DataConfig& data, const ModelConfig& model, RawAugment raw_augment) {
  const AugmentConfig& augment = data.augment;
  if (augment.random_resized_crop &&
      !(augment.scale[0] > 0 && augment.scale[0] <= augment.scale[1] && augment.ratio[0] > 0 &&
        augment.ratio[0] <= augment.ratio[1])) {
    throw std::invalid_argument("random_resized_crop: bad scale [" + std::to_string(augment.scale[0]) + ", " +
                                std::to_string(augment.scale[1]) + "] or ratio [" + std::to_string(augment.ratio[0]) +
                                ", " + std::to_string(augment.ratio[1]) + "]");
  }
  if (augment.pad_crop < 0) {
    throw std::invalid_argument("pad_crop " + std::to_string(augment.pad_crop) + " is negative");
  }
  auto plan = std::make_shared<const TrainPlan>(TrainPlan{model.img_h, model.img_w, model.in_chans,
                                                          data.preprocess.interpolation, augment,
                                                          Normalizer(data.preprocess, model.in_chans),
                                                          std::move(raw_augment), data.reduced_decode});
  return [plan](ImageInput input, std::mt19937_64& rng) { return train_transform(*plan, std::move(input), rng); };
}

MixParams sample_cutmix_box(std::mt19937_64& rng, double lambda, int64_t height, int64_t width) {
  // timm rand_bbox + cutmix_bbox_and_lam(correct_lam=True).
  const double ratio = std::sqrt(1.0 - lambda);
  const auto cut_h = static_cast<int64_t>(static_cast<double>(height) * ratio);
  const auto cut_w = static_cast<int64_t>(static_cast<double>(width) * ratio);
  const int64_t cy = uniform_int(rng, height);
  const int64_t cx = uniform_int(rng, width);
  MixParams params;
  params.cutmix = true;
  params.top = std::clamp<int64_t>(cy - cut_h / 2, 0, height);
  params.bottom = std::clamp<int64_t>(cy + cut_h / 2, 0, height);
  params.left = std::clamp<int64_t>(cx - cut_w / 2, 0, width);
  params.right = std::clamp<int64_t>(cx + cut_w / 2, 0, width);
  const double box_area = static_cast<double>((params.bottom - params.top) * (params.right - params.left));
  params.lambda = 1.0 - box_area / static_cast<double>(height * width);
  return params;
}

void apply_mix(Batch& batch, const MixParams& params, int64_t num_classes, double smoothing) {
  TORCH_CHECK(batch.images.defined() && batch.images.dim() == 4 && batch.images.scalar_type() == torch::kFloat32,
              "mixup/cutmix needs float32 (B, C, H, W) images, got ",
              batch.images.defined() ? c10::str(batch.images.sizes()) : std::string("none"));
  TORCH_CHECK(num_classes > 0, "mixup/cutmix needs num_classes > 0, got ", num_classes);
  if (!batch.images.is_contiguous()) batch.images = batch.images.contiguous();
  const int64_t B = batch.images.size(0), C = batch.images.size(1), H = batch.images.size(2),
                W = batch.images.size(3);
  TORCH_CHECK(batch.labels.defined() && batch.labels.numel() == B, "mixup/cutmix: ", B, " images but ",
              batch.labels.defined() ? batch.labels.numel() : 0, " labels");
  float* images = batch.images.data_ptr<float>();
  const int64_t row_size = C * H * W;

  // Row i mixes with row B-1-i: each pair is handled once, the middle row of an odd batch mixes with itself.
  if (params.cutmix) {
    for (int64_t i = 0; i < B / 2; ++i) {
      float* a = images + i * row_size;
      float* b = images + (B - 1 - i) * row_size;
      for (int64_t c = 0; c < C; ++c) {
        for (int64_t y = params.top; y < params.bottom; ++y) {
          const int64_t offset = (c * H + y) * W;
          std::swap_ranges(a + offset + params.left, a + offset + params.right, b + offset + params.left);
        }
      }
    }
  } else if (params.lambda != 1.0) {
    const auto keep = static_cast<float>(params.lambda), take = static_cast<float>(1.0 - params.lambda);
    for (int64_t i = 0; i < B / 2; ++i) {
      float* a = images + i * row_size;
      float* b = images + (B - 1 - i) * row_size;
      for (int64_t j = 0; j < row_size; ++j) {
        const float x = a[j], y = b[j];
        a[j] = x * keep + y * take;
        b[j] = y * keep + x * take;
      }
    }
  }

  const torch::Tensor labels = batch.labels.to(torch::kInt64).contiguous();
  const int64_t* label = labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < B; ++i) {
    TORCH_CHECK(label[i] >= 0 && label[i] < num_classes, "mixup/cutmix: label ", label[i], " of row ", i,
                " is outside [0, ", num_classes, ")");
  }
  const double off = smoothing / static_cast<double>(num_classes);
  const double on = 1.0 - smoothing + off;
  batch.soft_targets = torch::empty({B, num_classes}, torch::kFloat32);  // (B, K)
  float* targets = batch.soft_targets.data_ptr<float>();
  for (int64_t i = 0; i < B; ++i) {
    std::vector<double> row(num_classes, off);
    row[label[i]] += (on - off) * params.lambda;
    row[label[B - 1 - i]] += (on - off) * (1.0 - params.lambda);
    for (int64_t k = 0; k < num_classes; ++k) targets[i * num_classes + k] = static_cast<float>(row[k]);
  }
}

BatchTransform make_mix_transform(const AugmentConfig& augment, int64_t num_classes, double smoothing) {
  if (augment.mixup_alpha <= 0 && augment.cutmix_alpha <= 0) return {};
  if (num_classes <= 0) {
    throw std::invalid_argument("mixup/cutmix needs num_classes > 0, got " + std::to_string(num_classes));
  }
  const AugmentConfig config = augment;
  return [config, num_classes, smoothing](Batch& batch, std::mt19937_64& rng) {
    // timm Mixup._params_per_batch: same draws in the same order.
    MixParams params;
    if (uniform01(rng) < config.mix_prob) {
      bool use_cutmix = false;
      double lambda;
      if (config.mixup_alpha > 0 && config.cutmix_alpha > 0) {
        use_cutmix = uniform01(rng) < config.switch_prob;
        const double alpha = use_cutmix ? config.cutmix_alpha : config.mixup_alpha;
        lambda = sample_beta(rng, alpha, alpha);
      } else if (config.mixup_alpha > 0) {
        lambda = sample_beta(rng, config.mixup_alpha, config.mixup_alpha);
      } else {
        use_cutmix = true;
        lambda = sample_beta(rng, config.cutmix_alpha, config.cutmix_alpha);
      }
      if (use_cutmix) {
        params = sample_cutmix_box(rng, lambda, batch.images.size(2), batch.images.size(3));
      } else {
        params.lambda = lambda;
      }
    }
    apply_mix(batch, params, num_classes, smoothing);
  };
}

}  // namespace vit
