// Sample transforms for evaluation (= preprocess()) and training (crop, flip, normalise, erase), and timm-style
// mixup/cutmix on whole batches. Every random draw comes from the given mt19937_64 through our own sampling code,
// so augmented batches are bit-identical on every platform.
#pragma once

#include <cstdint>
#include <functional>
#include <random>

#include "config/config.h"
#include "data/image.h"
#include "data/loader.h"

namespace vit {

// In-place augmentation on 8-bit pixels, e.g. RandAugment from the vision library.
using RawAugment = std::function<void(RawImage& image, std::mt19937_64& rng)>;

// Gamma(shape, 1) by Marsaglia-Tsang and Beta(a, b) as X / (X + Y), on our own uniform/normal draws.
double sample_normal(std::mt19937_64& rng);
double sample_gamma(std::mt19937_64& rng, double shape);
double sample_beta(std::mt19937_64& rng, double a, double b);

// The evaluation transform: preprocess(image, data.preprocess, img_h, img_w, in_chans); ignores the RNG.
SampleTransform make_eval_transform(const DataConfig& data, const ModelConfig& model);

// Training: [reduced decoding] -> convert channels -> raw_augment (when given and randaugment_ops > 0) -> random resized crop to the
// model size (torchvision: 10 attempts, then a centre crop clamped to the ratio range), or plain resize to the model
// size (when sizes differ) then pad_crop (zero pad, random crop) -> horizontal flip with probability hflip ->
// normalise with the shared mean/std -> random erasing with probability random_erasing (timm: area 0.02..1/3,
// log aspect ratio in [log 0.3, log 3.3], per-pixel N(0, 1) noise). Output (C, H, W) float32.
// With data.reduced_decode, random_resized_crop and no RandAugment, an encoded input whose codec can window it (a
// JPEG) has its crop window drawn on the header's size (the same draws as above) and only that window decoded, at
// reduced_decode_scale(); the window is then resized to the model size. Evaluation transforms decode whole images.
SampleTransform make_train_transform(const DataConfig& data, const ModelConfig& model, RawAugment raw_augment = {});

// The largest DCT reduction (8, 4, 2, else 1) at which a crop_h x crop_w crop still covers out_h x out_w.
int reduced_decode_scale(int64_t crop_h, int64_t crop_w, int64_t out_h, int64_t out_w);

// Where and how a batch was mixed (exposed for tests).
struct MixParams {
  double lambda = 1.0;       // weight of the batch's own rows (after cutmix's box-area correction)
  bool cutmix = false;       // box paste rather than a blend
  int64_t top = 0, bottom = 0, left = 0, right = 0;  // cutmix box [top, bottom) x [left, right)
};

// timm's Mixup in batch mode: with probability mix_prob one lambda ~ Beta(alpha, alpha) per batch (cutmix instead
// of mixup with probability switch_prob when both are on); cutmix pastes a box of area 1 - lambda (clipped to the
// image, lambda corrected to the real box area); rows mix with the batch flipped (row i with row B-1-i).
// soft_targets = lambda * onehot_smooth(y) + (1 - lambda) * onehot_smooth(y_flipped), with label smoothing
// `smoothing`; they are set on every batch the transform sees (lambda = 1 when the batch was not mixed), as timm
// does. Returns an empty function when mixup and cutmix are both off.
BatchTransform make_mix_transform(const AugmentConfig& augment, int64_t num_classes, double smoothing);

// The mixing step itself, with explicit parameters (used by make_mix_transform and by tests).
void apply_mix(Batch& batch, const MixParams& params, int64_t num_classes, double smoothing);
// timm's cutmix box for `lambda` on an H x W image, with lambda corrected to the box area.
MixParams sample_cutmix_box(std::mt19937_64& rng, double lambda, int64_t height, int64_t width);

}  // namespace vit
