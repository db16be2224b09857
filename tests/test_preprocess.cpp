// The one preprocessing path (src/data/image.h): timm's float32 normalisation, PIL's channel conversion, resize and
// centre-crop geometry, antialiased resampling.
#include <gtest/gtest.h>

#include <iostream>
#include <random>

#include <torch/torch.h>

#include "data/image.h"
#include "test_util.h"

namespace vit {
namespace {

using test::error_of;
using test::gradient_image;

TEST(PreprocessNumerics, MatchesTimmFloat32ByHand) {
  RawImage image{2, 2, 3, {0, 128, 255, 1, 2, 3, 250, 127, 64, 10, 20, 30}};
  Preprocess p;  // mean = std = 0.5
  const torch::Tensor x = preprocess(image, p, 2, 2, 3);
  ASSERT_EQ(x.sizes(), (torch::IntArrayRef{3, 2, 2}));
  ASSERT_TRUE(x.is_contiguous());
  for (int64_t y = 0; y < 2; ++y) {
    for (int64_t x_ = 0; x_ < 2; ++x_) {
      for (int64_t c = 0; c < 3; ++c) {
        const float v = static_cast<float>(image.pixels[(y * 2 + x_) * 3 + c]);
        EXPECT_EQ(x[c][y][x_].item<float>(), (v / 255.0f - 0.5f) / 0.5f);
      }
    }
  }
  EXPECT_EQ(x[0][0][0].item<float>(), -1.0f);
  EXPECT_EQ(x[2][0][0].item<float>(), 1.0f);

  // Per-channel ImageNet statistics, in the same float32 order as timm's Normalize.
  p.mean = {0.485, 0.456, 0.406};
  p.std = {0.229, 0.224, 0.225};
  const torch::Tensor y = preprocess(image, p, 2, 2, 3);
  const torch::Tensor pixels =
      torch::tensor(std::vector<float>(image.pixels.begin(), image.pixels.end())).reshape({2, 2, 3}).permute({2, 0, 1});
  const torch::Tensor reference = (pixels / 255.0f - torch::tensor({0.485f, 0.456f, 0.406f}).reshape({3, 1, 1})) /
                                  torch::tensor({0.229f, 0.224f, 0.225f}).reshape({3, 1, 1});
  EXPECT_TRUE(torch::equal(y, reference)) << (y - reference).abs().max().item<float>();

  p.mean = {0.5};
  p.std = {0.25};
  EXPECT_EQ(preprocess(image, p, 2, 2, 1).size(0), 1);
  p.mean = {0.5, 0.5, 0.5};  // equal entries broadcast to any channel count
  EXPECT_EQ(preprocess(image, p, 2, 2, 1).size(0), 1);
  p.mean = {0.4, 0.5};
  EXPECT_NE(error_of([&] { preprocess(image, p, 2, 2, 3); }).find("mean has 2 entries; expected 1 or 3"),
            std::string::npos);
  p.mean = {0.4, 0.5, 0.6};
  EXPECT_NE(error_of([&] { preprocess(image, p, 2, 2, 1); }).find("mean has 3 entries; expected 1 or 1"),
            std::string::npos);
}

TEST(PreprocessChannels, ConvertsLikePil) {
  const RawImage rgb{1, 3, 3, {255, 0, 0, 0, 255, 0, 0, 0, 255}};
  const RawImage grey = convert_channels(rgb, 1);
  EXPECT_EQ(grey.pixels, (std::vector<uint8_t>{76, 150, 29}));  // PIL "L" of pure red, green, blue
  const RawImage rgba{1, 1, 4, {10, 20, 30, 40}};
  EXPECT_EQ(convert_channels(rgba, 3).pixels, (std::vector<uint8_t>{10, 20, 30}));
  EXPECT_EQ(convert_channels(RawImage{1, 1, 1, {7}}, 3).pixels, (std::vector<uint8_t>{7, 7, 7}));
  EXPECT_NE(error_of([&] { convert_channels(RawImage{1, 1, 2, {1, 2}}, 3); }).find("2 channels to 3"),
            std::string::npos);
}

TEST(PreprocessGeometry, ShapesForSquareRectangularAndCropPct) {
  const RawImage image = gradient_image(64, 48, 3);
  Preprocess p;
  EXPECT_EQ(preprocess(image, p, 32, 32, 3).sizes(), (torch::IntArrayRef{3, 32, 32}));
  EXPECT_EQ(preprocess(image, p, 24, 40, 3).sizes(), (torch::IntArrayRef{3, 24, 40}));

  // Square, crop_pct 0.875: shorter side 48 -> floor(32 / 0.875) = 36, longer 64 -> int(36 * 64 / 48) = 48,
  // then the centre 32x32 at offsets (8, 2).
  p.crop_pct = 0.875;
  const torch::Tensor square = preprocess(image, p, 32, 32, 3);
  ASSERT_EQ(square.sizes(), (torch::IntArrayRef{3, 32, 32}));
  const RawImage resized = resize_image(image, 48, 36, p.interpolation);
  EXPECT_TRUE(torch::equal(square, preprocess(crop_image(resized, 8, 2, 32, 32), Preprocess{}, 32, 32, 3)));

  // Rectangular (24, 32), crop_pct 0.8, both sides to cover (30, 40) with the aspect ratio kept (timm's
  // ResizeKeepRatio): factor min(64 / 30, 48 / 40) = 1.2, so (round(53.3), 40) = (53, 40); centre crop at (14, 4)
  // (round(14.5) = 14, ties to even).
  p.crop_pct = 0.8;
  const torch::Tensor rectangle = preprocess(image, p, 24, 32, 3);
  ASSERT_EQ(rectangle.sizes(), (torch::IntArrayRef{3, 24, 32}));
  const RawImage kept = resize_image(image, 53, 40, p.interpolation);
  EXPECT_TRUE(torch::equal(rectangle, preprocess(crop_image(kept, 14, 4, 24, 32), Preprocess{}, 24, 32, 3)));
  // crop_mode squash: straight to (30, 40), centre crop at (3, 4).
  p.crop_mode = CropMode::squash;
  const torch::Tensor squashed = preprocess(image, p, 24, 32, 3);
  const RawImage stretched = resize_image(image, 30, 40, p.interpolation);
  EXPECT_TRUE(torch::equal(squashed, preprocess(crop_image(stretched, 3, 4, 24, 32), Preprocess{}, 24, 32, 3)));
  p.crop_mode = CropMode::center;

  p.crop_pct = 1.5;
  EXPECT_NE(error_of([&] { preprocess(image, p, 32, 32, 3); }).find("crop_pct"), std::string::npos);
  // An unknown interpolation cannot reach here: it is an enum, refused when the config is parsed (ConfigEnums).
}

TEST(PreprocessGeometry, CentreCropRoundsLikePython) {
  EXPECT_EQ(centre_crop_offset(10, 4), 3);
  EXPECT_EQ(centre_crop_offset(5, 2), 2);  // round(1.5) = 2
  EXPECT_EQ(centre_crop_offset(7, 2), 2);  // round(2.5) = 2
  EXPECT_EQ(centre_crop_offset(9, 2), 4);  // round(3.5) = 4
}

TEST(PreprocessResize, ConstantStaysConstantAndStripesAverage) {
  for (const Interpolation mode : {Interpolation::bilinear, Interpolation::bicubic}) {
    const RawImage flat{9, 7, 1, std::vector<uint8_t>(63, 200)};
    for (const auto& [h, w] : std::vector<std::pair<int64_t, int64_t>>{{3, 3}, {20, 15}, {9, 3}}) {
      const RawImage out = resize_image(flat, h, w, mode);
      ASSERT_EQ(static_cast<int64_t>(out.pixels.size()), h * w);
      for (uint8_t v : out.pixels) EXPECT_EQ(v, 200) << name_of(mode) << " " << h << "x" << w;
    }
    // Antialiased 2x shrink of 1-pixel stripes averages them (without antialiasing it would alias to 0 or 255).
    // Away from the borders (the widened bicubic filter reaches 4 input pixels out) the taps pair up symmetrically.
    RawImage stripes{4, 16, 1, {}};
    for (int64_t y = 0; y < 4; ++y) {
      for (int64_t x = 0; x < 16; ++x) stripes.pixels.push_back(x % 2 ? 255 : 0);
    }
    const RawImage half = resize_image(stripes, 4, 8, mode);
    for (int64_t x = 2; x < 6; ++x) EXPECT_NEAR(half.pixels[2 * 8 + x], 127.5, 0.51) << name_of(mode);
  }
}

// The horizontal pass runs rows in blocks, one vector lane per row; the vertical pass runs along whole rows. Both apply
// the same taps with the same rounding, so resizing only the width must equal resizing only the height of the
// transposed image, transposed back, byte for byte: for channel counts 1 to 5, for row counts on both sides of a block
// (8 rows), for shrinking and for enlarging.
TEST(PreprocessResize, HorizontalPassEqualsTheVerticalOnTheTranspose) {
  const auto transpose = [](const RawImage& image) {
    RawImage out{image.width, image.height, image.channels, std::vector<uint8_t>(image.pixels.size())};
    const int64_t C = image.channels;
    for (int64_t y = 0; y < image.height; ++y) {
      for (int64_t x = 0; x < image.width; ++x) {
        for (int64_t c = 0; c < C; ++c) {
          out.pixels[(x * image.height + y) * C + c] = image.pixels[(y * image.width + x) * C + c];
        }
      }
    }
    return out;
  };
  std::mt19937 rng(7);
  int64_t cases = 0;
  for (const Interpolation mode : {Interpolation::bilinear, Interpolation::bicubic}) {
    for (const int64_t C : {1, 2, 3, 4, 5}) {
      for (const int64_t H : {1, 7, 8, 9, 17, 23}) {
        for (const auto& [W, out_width] : std::vector<std::pair<int64_t, int64_t>>{{37, 13}, {13, 29}, {50, 49}}) {
          RawImage image{H, W, C, std::vector<uint8_t>(H * W * C)};
          for (auto& v : image.pixels) v = static_cast<uint8_t>(rng() % 256);
          const RawImage across = resize_image(image, H, out_width, mode);
          const RawImage down = transpose(resize_image(transpose(image), out_width, H, mode));
          ASSERT_EQ(across.pixels, down.pixels)
              << name_of(mode) << " C=" << C << " H=" << H << " " << W << "->" << out_width;
          ++cases;
        }
      }
    }
  }
  std::cout << cases << " sizes: the horizontal pass equals the vertical on the transpose, byte for byte\n";
}

}  // namespace
}  // namespace vit
