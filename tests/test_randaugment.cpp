// RandAugment (src/image/randaugment.h): shape-preserving and seeded, each op with timm's semantics, and inside the
// train transform.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>

#include "data/augment.h"
#include "image/randaugment.h"
#include "test_util.h"

namespace vit {
namespace {

RawImage pattern_image(int64_t H, int64_t W, int64_t C) {
  RawImage image{H, W, C, {}};
  for (int64_t i = 0; i < H * W * C; ++i) image.pixels.push_back(static_cast<uint8_t>((i * 37 + i / 7) % 200 + 20));
  return image;
}

TEST(RandAugment, PreservesShapeAndIsDeterministic) {
  const RawAugment augment = make_randaugment(2, 9);
  for (int64_t channels : {1, 3}) {
    const RawImage original = pattern_image(20, 24, channels);
    int changed = 0;
    for (uint64_t seed = 0; seed < 20; ++seed) {
      RawImage a = original, b = original;
      std::mt19937_64 rng_a(seed), rng_b(seed);
      augment(a, rng_a);
      augment(b, rng_b);
      ASSERT_EQ(a.height, 20);
      ASSERT_EQ(a.width, 24);
      ASSERT_EQ(a.channels, channels);
      ASSERT_EQ(a.pixels.size(), original.pixels.size());
      EXPECT_EQ(a.pixels, b.pixels);
      changed += a.pixels != original.pixels;
    }
    EXPECT_GT(changed, 5) << channels << " channels";
  }
  EXPECT_THROW(make_randaugment(2, 31), std::invalid_argument);
}

TEST(RandAugment, OpsFollowTimmSemantics) {
  for (const std::string& op : randaugment_op_names()) {
    for (int64_t channels : {1, 3}) {
      RawImage image = pattern_image(9, 11, channels);
      apply_randaugment_op(image, op, 9, true);
      EXPECT_EQ(image.pixels.size(), static_cast<size_t>(9 * 11 * channels)) << op;
    }
  }
  const RawImage original = pattern_image(10, 20, 3);
  RawImage image = original;
  apply_randaugment_op(image, "Identity", 9, false);
  EXPECT_EQ(image.pixels, original.pixels);

  image = original;  // threshold 0: every pixel inverted
  apply_randaugment_op(image, "Solarize", 0, false);
  for (size_t i = 0; i < image.pixels.size(); ++i) EXPECT_EQ(image.pixels[i], 255 - original.pixels[i]);

  image = original;  // magnitude 10 keeps int(4) = 4 bits
  apply_randaugment_op(image, "Posterize", 10, false);
  for (size_t i = 0; i < image.pixels.size(); ++i) EXPECT_EQ(image.pixels[i], original.pixels[i] & 0xF0);

  image = original;  // factor 0.1 at magnitude 0
  apply_randaugment_op(image, "Brightness", 0, false);
  for (size_t i = 0; i < image.pixels.size(); ++i) EXPECT_NEAR(image.pixels[i], original.pixels[i] * 0.1, 0.51);

  image = original;  // the pattern spans 20..219: stretched to 0..255
  apply_randaugment_op(image, "AutoContrast", 0, false);
  EXPECT_EQ(*std::min_element(image.pixels.begin(), image.pixels.end()), 0);
  EXPECT_EQ(*std::max_element(image.pixels.begin(), image.pixels.end()), 255);

  image = original;  // 0.45 * 20 = 9 pixels left: output x reads input x + 9, grey beyond the edge
  apply_randaugment_op(image, "TranslateX", 10, false);
  for (int64_t c = 0; c < 3; ++c) {
    EXPECT_EQ(image.pixels[(4 * 20 + 2) * 3 + c], original.pixels[(4 * 20 + 11) * 3 + c]);
    EXPECT_EQ(image.pixels[(4 * 20 + 15) * 3 + c], 128);
  }

  image = original;
  apply_randaugment_op(image, "Rotate", 0, false);
  EXPECT_EQ(image.pixels, original.pixels);
  EXPECT_THROW(apply_randaugment_op(image, "Invert", 5, false), std::invalid_argument);
  RawImage rgba{2, 2, 4, std::vector<uint8_t>(16, 1)};
  EXPECT_THROW(apply_randaugment_op(rgba, "Identity", 5, false), std::invalid_argument);
}

TEST(RandAugment, InsideTheTrainTransform) {
  DataConfig data;
  data.augment.randaugment_ops = 2;
  data.augment.randaugment_magnitude = 9;
  const ModelConfig model = test::input_model(16, 16, 3);
  const RawAugment randaugment = make_randaugment(data.augment.randaugment_ops, data.augment.randaugment_magnitude);
  const SampleTransform transform = make_train_transform(data, model, randaugment);
  const RawImage image = pattern_image(16, 16, 3);
  std::mt19937_64 a(4), b(4);
  EXPECT_TRUE(torch::equal(transform(image, a), transform(image, b)));
}

}  // namespace
}  // namespace vit
