// Training augmentation (src/data/augment.h): mixup and cutmix, their random draws, the per-sample train transform
// (pad-crop, flip, random resized crop, erasing, RandAugment's hook) and the eval transform equal to preprocess.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <atomic>
#include <set>

#include "data/augment.h"
#include "data/dataset.h"
#include "data/image.h"
#include "data/loader.h"
#include "test_util.h"

namespace vit {
namespace {

using test::gradient_image;
using test::input_model;

Batch ramp_batch(int64_t B, int64_t C, int64_t H, int64_t W) {
  Batch batch;
  batch.images = torch::arange(B * C * H * W, torch::kFloat32).reshape({B, C, H, W});  // (B, C, H, W)
  batch.labels = torch::arange(B, torch::kInt64) % 5;
  for (int64_t i = 0; i < B; ++i) batch.indices.push_back(i);
  return batch;
}

TEST(AugmentMix, MixupBlendsWithTheFlippedBatch) {
  Batch batch = ramp_batch(5, 2, 3, 3);
  const torch::Tensor original = batch.images.clone();
  MixParams params;
  params.lambda = 0.7;
  apply_mix(batch, params, 5, 0.1);
  const torch::Tensor expected = original * 0.7f + original.flip(0) * 0.3f;
  EXPECT_LT((batch.images - expected).abs().max().item<float>(), 1e-4);
  ASSERT_EQ(batch.soft_targets.sizes(), (torch::IntArrayRef{5, 5}));
  EXPECT_LT((batch.soft_targets.sum(1) - 1).abs().max().item<float>(), 1e-6);
  // Row 0 (label 0) mixes with row 4 (label 4): 0.7 * (0.9 + 0.02) + 0.3 * 0.02 on class 0.
  EXPECT_NEAR(batch.soft_targets[0][0].item<float>(), 0.7 * 0.92 + 0.3 * 0.02, 1e-6);
  EXPECT_NEAR(batch.soft_targets[0][4].item<float>(), 0.7 * 0.02 + 0.3 * 0.92, 1e-6);
}

TEST(AugmentMix, CutmixLambdaMatchesTheBox) {
  for (uint64_t seed = 0; seed < 50; ++seed) {
    std::mt19937_64 rng(seed);
    const double lambda = sample_beta(rng, 1.0, 1.0);
    const MixParams params = sample_cutmix_box(rng, lambda, 9, 7);
    const double area = static_cast<double>((params.bottom - params.top) * (params.right - params.left));
    EXPECT_DOUBLE_EQ(params.lambda, 1.0 - area / 63.0);
    ASSERT_TRUE(params.top >= 0 && params.top <= params.bottom && params.bottom <= 9);
    ASSERT_TRUE(params.left >= 0 && params.left <= params.right && params.right <= 7);
  }
  Batch batch = ramp_batch(4, 1, 6, 6);
  const torch::Tensor original = batch.images.clone();
  MixParams params;
  params.cutmix = true;
  params.top = 1, params.bottom = 4, params.left = 2, params.right = 5;
  params.lambda = 1.0 - 9.0 / 36.0;
  apply_mix(batch, params, 5, 0.0);
  const torch::Tensor flipped = original.flip(0);
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t y = 0; y < 6; ++y) {
      for (int64_t x = 0; x < 6; ++x) {
        const bool inside = y >= 1 && y < 4 && x >= 2 && x < 5;
        EXPECT_EQ(batch.images[i][0][y][x].item<float>(),
                  (inside ? flipped : original)[i][0][y][x].item<float>());
      }
    }
    EXPECT_NEAR(batch.soft_targets[i].sum().item<float>(), 1.0, 1e-6);
  }
  EXPECT_NEAR(batch.soft_targets[0][0].item<float>(), 0.75, 1e-6);  // label 0, flipped partner has label 3
  EXPECT_NEAR(batch.soft_targets[0][3].item<float>(), 0.25, 1e-6);
}

TEST(AugmentMix, TransformSetsSoftTargetsAndIsOffWhenDisabled) {
  AugmentConfig augment;
  EXPECT_FALSE(make_mix_transform(augment, 5, 0.1));
  augment.mixup_alpha = 0.8;
  augment.cutmix_alpha = 1.0;
  const BatchTransform mix = make_mix_transform(augment, 5, 0.1);
  ASSERT_TRUE(mix);
  int changed = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    Batch batch = ramp_batch(6, 1, 8, 8);
    const torch::Tensor original = batch.images.clone();
    std::mt19937_64 rng(seed);
    mix(batch, rng);
    ASSERT_TRUE(batch.soft_targets.defined());
    EXPECT_LT((batch.soft_targets.sum(1) - 1).abs().max().item<float>(), 1e-6);
    changed += !torch::equal(batch.images, original);
    Batch again = ramp_batch(6, 1, 8, 8);
    std::mt19937_64 same(seed);
    mix(again, same);
    EXPECT_TRUE(torch::equal(batch.images, again.images));
  }
  EXPECT_GT(changed, 10);
}

TEST(AugmentRandom, GammaAndBetaHaveTheRightMoments) {
  std::mt19937_64 rng(123);
  for (double shape : {0.3, 1.0, 2.5}) {
    double sum = 0;
    const int n = 20000;
    for (int i = 0; i < n; ++i) sum += sample_gamma(rng, shape);
    EXPECT_NEAR(sum / n, shape, 0.05 * shape + 0.02) << "shape " << shape;
  }
  double sum = 0, sum_sq = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const double x = sample_beta(rng, 0.5, 0.5);
    ASSERT_TRUE(x >= 0.0 && x <= 1.0);
    sum += x;
    sum_sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.01);
  EXPECT_NEAR(sum_sq / n - 0.25, 0.125, 0.01);  // Var Beta(1/2, 1/2) = 1/8
}

TEST(AugmentTrain, ShapeAndDeterminism) {
  DataConfig data;
  data.augment.pad_crop = 4;
  data.augment.hflip = 0.5;
  data.augment.random_erasing = 0.5;
  const SampleTransform transform = make_train_transform(data, input_model(28, 28, 1));
  const RawImage image = gradient_image(28, 28, 1);
  std::set<std::string> distinct;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    std::mt19937_64 a(seed), b(seed);
    const torch::Tensor x = transform(image, a), y = transform(image, b);
    ASSERT_EQ(x.sizes(), (torch::IntArrayRef{1, 28, 28}));
    EXPECT_TRUE(torch::equal(x, y));
    distinct.insert(std::to_string(x.sum().item<double>()));
  }
  EXPECT_GT(distinct.size(), 10u);

  DataConfig crop;
  crop.augment.random_resized_crop = true;
  const SampleTransform rrc = make_train_transform(crop, input_model(16, 12, 3));
  std::mt19937_64 rng(1);
  const torch::Tensor x = rrc(gradient_image(30, 40, 1), rng);
  EXPECT_EQ(x.sizes(), (torch::IntArrayRef{3, 16, 12}));
  EXPECT_LE(x.max().item<float>(), 1.0f);
  EXPECT_GE(x.min().item<float>(), -1.0f);
}

TEST(AugmentTrain, FlipAndPadCropGeometry) {
  const RawImage image = gradient_image(6, 5, 3);
  DataConfig data;
  const torch::Tensor plain = preprocess(image, data.preprocess, 6, 5, 3);
  data.augment.hflip = 1.0;
  std::mt19937_64 rng(0);
  EXPECT_TRUE(torch::equal(make_train_transform(data, input_model(6, 5, 3))(image, rng), plain.flip(2)));

  DataConfig padded;
  padded.augment.pad_crop = 2;
  const SampleTransform transform = make_train_transform(padded, input_model(6, 5, 3));
  const float zero = (0.0f / 255.0f - 0.5f) / 0.5f;
  for (uint64_t seed = 0; seed < 30; ++seed) {
    std::mt19937_64 r(seed);
    const torch::Tensor x = transform(image, r);
    // Every output row/column is either a shifted copy of the input or zero padding.
    int matches = 0;
    for (int64_t dy = -2; dy <= 2; ++dy) {
      for (int64_t dx = -2; dx <= 2; ++dx) {
        bool same = true;
        for (int64_t y = 0; y < 6 && same; ++y) {
          for (int64_t x_ = 0; x_ < 5 && same; ++x_) {
            const int64_t sy = y + dy, sx = x_ + dx;
            const bool inside = sy >= 0 && sy < 6 && sx >= 0 && sx < 5;
            for (int64_t c = 0; c < 3; ++c) {
              const float expected = inside ? plain[c][sy][sx].item<float>() : zero;
              same = same && x[c][y][x_].item<float>() == expected;
            }
          }
        }
        matches += same;
      }
    }
    EXPECT_EQ(matches, 1) << "seed " << seed;
  }
}

TEST(AugmentTrain, RawAugmentRunsOnlyWithRandAugmentOps) {
  std::atomic<int> calls{0};
  const RawAugment count_calls = [&](RawImage& image, std::mt19937_64&) {
    ++calls;
    EXPECT_EQ(image.channels, 1);  // after channel conversion
  };
  DataConfig data;
  std::mt19937_64 rng(0);
  make_train_transform(data, input_model(4, 4, 1), count_calls)(gradient_image(4, 4, 3), rng);
  EXPECT_EQ(calls.load(), 0);
  data.augment.randaugment_ops = 2;
  make_train_transform(data, input_model(4, 4, 1), count_calls)(gradient_image(4, 4, 3), rng);
  EXPECT_EQ(calls.load(), 1);
}

TEST(AugmentEval, EqualsPreprocess) {
  DataConfig data;
  data.preprocess.crop_pct = 0.9;
  const SampleTransform transform = make_eval_transform(data, input_model(20, 20, 3));
  const RawImage image = gradient_image(31, 25, 3);
  std::mt19937_64 rng(0);
  EXPECT_TRUE(torch::equal(transform(image, rng), preprocess(image, data.preprocess, 20, 20, 3)));
}

}  // namespace
}  // namespace vit
