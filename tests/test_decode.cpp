// Image decoding through OpenCV (src/image/decode.h): channels and bit depths in RGB order, a reference image read
// independently, and broken files failing with one line that names the file; JPEG windows at reduced scale against
// whole decodes, and the training transform's reduced decoding against full decoding.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <torch/torch.h>

#include "data/augment.h"
#include "image/decode.h"
#include "util/fs.h"
#include "test_util.h"

namespace vit {
namespace {

using test::TempDir;
using test::error_of;
using test::write_bytes;

cv::Mat noise_image(int rows, int cols, int type, uint64_t seed) {
  cv::Mat image(rows, cols, type);
  cv::RNG rng(seed);
  rng.fill(image, cv::RNG::UNIFORM, 0, 256);
  return image;
}

void expect_error(const std::string& path, const std::string& phrase) {
  const std::string message = error_of([&] { decode_image(path); });
  EXPECT_EQ(message.rfind(path, 0), 0u) << "should start with the path: " << message;
  EXPECT_NE(message.find(phrase), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
}

TEST(DecodeFormats, ChannelsAndDepths) {
  TempDir dir;
  cv::Mat grey(4, 5, CV_8UC1);
  for (int i = 0; i < 20; ++i) grey.data[i] = static_cast<uint8_t>(i * 12);
  ASSERT_TRUE(cv::imwrite(dir / "grey.png", grey));
  const RawImage g = decode_image(dir / "grey.png");
  ASSERT_EQ(g.height, 4);
  ASSERT_EQ(g.width, 5);
  ASSERT_EQ(g.channels, 1);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(g.pixels[i], i * 12);

  ASSERT_TRUE(cv::imwrite(dir / "bgr.png", cv::Mat(3, 2, CV_8UC3, cv::Scalar(10, 20, 30))));
  const RawImage rgb = decode_image(dir / "bgr.png");
  ASSERT_EQ(rgb.channels, 3);
  EXPECT_EQ(std::vector<uint8_t>(rgb.pixels.begin(), rgb.pixels.begin() + 3), (std::vector<uint8_t>{30, 20, 10}));

  ASSERT_TRUE(cv::imwrite(dir / "bgra.png", cv::Mat(2, 2, CV_8UC4, cv::Scalar(10, 20, 30, 40))));
  const RawImage rgba = decode_image(dir / "bgra.png");
  ASSERT_EQ(rgba.channels, 4);
  EXPECT_EQ(std::vector<uint8_t>(rgba.pixels.begin(), rgba.pixels.begin() + 4),
            (std::vector<uint8_t>{30, 20, 10, 40}));

  cv::Mat deep(1, 4, CV_16UC1);
  const uint16_t values[] = {0, 257 * 100, 65535, 1000};
  for (int i = 0; i < 4; ++i) deep.at<uint16_t>(0, i) = values[i];
  ASSERT_TRUE(cv::imwrite(dir / "deep.png", deep));
  EXPECT_EQ(decode_image(dir / "deep.png").pixels, (std::vector<uint8_t>{0, 100, 255, 4}));  // 1000 / 257 = 3.89

  ASSERT_TRUE(cv::imwrite(dir / "flat.jpg", cv::Mat(16, 16, CV_8UC3, cv::Scalar(40, 120, 200)),
                          {cv::IMWRITE_JPEG_QUALITY, 100}));
  const RawImage jpeg = decode_image(dir / "flat.jpg");
  ASSERT_EQ(jpeg.channels, 3);
  EXPECT_NEAR(jpeg.pixels[0], 200, 3);
  EXPECT_NEAR(jpeg.pixels[2], 40, 3);
}

// Every format vit decodes has its size read from the header alone, as OpenCV then decodes it.
TEST(ImageHeaders, SizesOfEveryFormatMatchTheDecodedImage) {
  for (const char* extension : {".jpg", ".png", ".bmp", ".tiff", ".webp", ".ppm", ".pgm"}) {
    const bool grey = std::string(extension) == ".pgm";
    std::vector<uint8_t> encoded;
    ASSERT_TRUE(cv::imencode(extension, noise_image(37, 53, grey ? CV_8UC1 : CV_8UC3, 5), encoded));
    const std::string bytes(encoded.begin(), encoded.end());
    const ImageHeader header = read_image_header(bytes, extension);
    EXPECT_EQ(header.height, 37) << extension;
    EXPECT_EQ(header.width, 53) << extension;
    const RawImage image = decode_image_bytes(bytes, extension);
    EXPECT_EQ(image.height, 37) << extension;
  }
  // Lossless and alpha WebP carry their size in other chunks (VP8L, VP8X).
  for (const int type : {CV_8UC3, CV_8UC4}) {
    std::vector<uint8_t> encoded;
    ASSERT_TRUE(cv::imencode(".webp", noise_image(9, 300, type, 6), encoded, {cv::IMWRITE_WEBP_QUALITY, 101}));
    const ImageHeader header = read_image_header(std::string(encoded.begin(), encoded.end()), "lossless.webp");
    EXPECT_EQ(header.height, 9);
    EXPECT_EQ(header.width, 300);
  }
}

// A header that declares more pixels than the limit fails at once, before any decoding: the files below hold only
// their headers, so decoding them could not succeed anyway, but the message says the size.
TEST(ImageHeaders, DecompressionBombsFailOnTheirHeader) {
  auto be32 = [](uint32_t v) {
    return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                       static_cast<char>(v)};
  };
  auto le32 = [](uint32_t v) {
    return std::string{static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16),
                       static_cast<char>(v >> 24)};
  };
  const std::string png = std::string("\x89PNG\r\n\x1a\n", 8) + be32(13) + "IHDR" + be32(100000) + be32(50000) +
                          std::string("\x08\x02\0\0\0", 5) + be32(0) + be32(0) + "IEND" + be32(0);
  const std::string bmp = "BM" + le32(0) + le32(0) + le32(54) + le32(40) + le32(30000) + le32(30000) +
                          std::string(28, '\0');
  const std::string pnm = "P6\n# a comment\n40000 40000\n255\n";
  const std::string webp = "RIFF" + le32(30) + "WEBPVP8X" + le32(10) + std::string(4, '\0') +
                           std::string("\xff\xff\x3f\xff\xff\x3f", 6);  // 4194304 x 4194304
  const std::pair<std::string, std::string> bombs[] = {{"bomb.png", png}, {"bomb.bmp", bmp}, {"bomb.ppm", pnm},
                                                       {"bomb.webp", webp}};
  for (const auto& bomb : bombs) {
    const std::string& name = bomb.first;
    const std::string message = error_of([&] { decode_image_bytes(bomb.second, name); });
    EXPECT_EQ(message.rfind(name + ": ", 0), 0u) << message;
    EXPECT_NE(message.find("pixels, over the limit of 178956970"), std::string::npos) << message;
  }
  EXPECT_NE(error_of([&] { decode_image_bytes(png, "bomb.png"); }).find("PNG of 100000x50000 is 5000000000 pixels"),
            std::string::npos);
  // The limit is the caller's: a small image over a tiny limit fails the same way, under it decodes.
  std::vector<uint8_t> encoded;
  ASSERT_TRUE(cv::imencode(".png", noise_image(10, 10, CV_8UC3, 7), encoded));
  const std::string small(encoded.begin(), encoded.end());
  EXPECT_NE(error_of([&] { decode_image_bytes(small, "s.png", ImageLimits{1 << 20, 99}); }).find("over the limit of 99"),
            std::string::npos);
  EXPECT_EQ(decode_image_bytes(small, "s.png", ImageLimits{1 << 20, 100}).width, 10);

  // Formats outside the list, and headers cut short or declaring nothing, fail by name.
  EXPECT_NE(error_of([&] { decode_image_bytes("GIF89a\x01\0\x01\0", "a.gif"); }).find("not an image format vit decodes"),
            std::string::npos);
  EXPECT_NE(error_of([&] { decode_image_bytes(png.substr(0, 20), "cut.png"); }).find("PNG header cut short"),
            std::string::npos);
  const std::string zero_png = std::string("\x89PNG\r\n\x1a\n", 8) + be32(13) + "IHDR" + be32(0) + be32(7);
  EXPECT_NE(error_of([&] { decode_image_bytes(zero_png, "zero.png"); }).find("header declares a size of 0x7"),
            std::string::npos);
}

// A JPEG of many scans (each one a pass over the whole image when decoded) fails before decoding.
TEST(ImageHeaders, JpegsWithTooManyScansFailUndecoded) {
  std::vector<uint8_t> encoded;
  ASSERT_TRUE(cv::imencode(".jpg", noise_image(16, 16, CV_8UC3, 9), encoded));
  const std::string jpeg(encoded.begin(), encoded.end());
  const size_t sos = jpeg.find("\xff\xda");
  ASSERT_NE(sos, std::string::npos);
  const std::string head = jpeg.substr(0, sos), scan = jpeg.substr(sos, jpeg.size() - 2 - sos);  // scan without EOI
  std::string many = head;
  for (int i = 0; i < 501; ++i) many += scan;
  many += "\xff\xd9";
  EXPECT_NE(error_of([&] { decode_image_bytes(many, "many.jpg"); })
                .find("many.jpg: JPEG with 501 scans, over the limit of 500"),
            std::string::npos);
  std::string few = head;
  for (int i = 0; i < 3; ++i) few += scan;
  EXPECT_EQ(error_of([&] { read_image_header(few + "\xff\xd9", "few.jpg"); }), "(no error)");
}

// From a path, the file-size limit applies before the file is read.
TEST(ImageHeaders, FilesOverTheSizeLimitAreNotRead) {
  TempDir dir;
  std::vector<uint8_t> encoded;
  ASSERT_TRUE(cv::imencode(".png", noise_image(64, 64, CV_8UC3, 8), encoded));
  write_bytes(dir / "noise.png", std::string(encoded.begin(), encoded.end()));
  const ImageLimits limits{static_cast<int64_t>(encoded.size()) - 1, 178956970};
  EXPECT_EQ(error_of([&] { decode_image(dir / "noise.png", limits); }),
            dir / "noise.png" + ": " + std::to_string(encoded.size()) + " bytes is over the limit of " +
                std::to_string(encoded.size() - 1) + " bytes for this file");
  EXPECT_EQ(decode_image(dir / "noise.png").width, 64);
  vit::make_dirs(dir / "folder.png");
  EXPECT_EQ(error_of([&] { decode_image(dir / "folder.png"); }),
            dir / "folder.png" + ": is a directory with no image files in it");
}

TEST(DecodeErrors, BrokenFilesNameTheFile) {
  TempDir dir;
  write_bytes(dir / "empty.png", "");
  expect_error(dir / "empty.png", "empty file");

  std::vector<uint8_t> jpeg;
  ASSERT_TRUE(cv::imencode(".jpg", noise_image(64, 64, CV_8UC3, 1), jpeg));
  write_bytes(dir / "cut.jpg", std::string(jpeg.begin(), jpeg.begin() + jpeg.size() / 2));
  expect_error(dir / "cut.jpg", "truncated JPEG");
  write_bytes(dir / "cut_by_two.jpg", std::string(jpeg.begin(), jpeg.end() - 2));  // only the EOI marker missing
  expect_error(dir / "cut_by_two.jpg", "truncated JPEG");
  write_bytes(dir / "whole.jpg", std::string(jpeg.begin(), jpeg.end()) + "trailing bytes");
  EXPECT_EQ(decode_image(dir / "whole.jpg").height, 64);

  std::vector<uint8_t> png;
  ASSERT_TRUE(cv::imencode(".png", noise_image(32, 32, CV_8UC3, 2), png));
  write_bytes(dir / "cut.png", std::string(png.begin(), png.begin() + png.size() * 2 / 3));
  expect_error(dir / "cut.png", "truncated PNG");

  write_bytes(dir / "text.jpg", "this is not an image\n");
  expect_error(dir / "text.jpg", "not an image format vit decodes (JPEG, PNG, BMP, TIFF, WebP, PNM); the file starts "
                                 "with bytes 74 68 69 73");

  const std::string missing = dir / "missing.png";
  EXPECT_NE(error_of([&] { decode_image(missing); }).find(missing), std::string::npos);
}

TEST(DecodeFormats, ChelseaReferenceImage) {
  const RawImage image = decode_image(VIT_TEST_DATA "/tiny32/chelsea.png");
  ASSERT_EQ(image.height, 32);
  ASSERT_EQ(image.width, 32);
  ASSERT_EQ(image.channels, 3);
  // Reference values from an independent PNG reader (Python zlib + unfiltering), in RGB order.
  const auto pixel = [&](int y, int x) {
    const uint8_t* p = image.pixels.data() + (y * 32 + x) * 3;
    return std::vector<int>{p[0], p[1], p[2]};
  };
  EXPECT_EQ(pixel(0, 0), (std::vector<int>{138, 85, 66}));
  EXPECT_EQ(pixel(5, 7), (std::vector<int>{155, 114, 76}));
  EXPECT_EQ(pixel(31, 31), (std::vector<int>{192, 167, 151}));
  int64_t sums[3] = {0, 0, 0};
  for (size_t i = 0; i < image.pixels.size(); ++i) sums[i % 3] += image.pixels[i];
  EXPECT_EQ(sums[0], 151744);
  EXPECT_EQ(sums[1], 110825);
  EXPECT_EQ(sums[2], 80230);
}

// A photo-like JPEG: smooth colour gradients, a few soft shapes and mild noise, 4:2:0 at quality 90.
std::string photo_jpeg(int rows, int cols, uint64_t seed, bool grey = false) {
  cv::Mat image(rows, cols, CV_8UC3);
  for (int y = 0; y < rows; ++y) {
    for (int x = 0; x < cols; ++x) {
      image.at<cv::Vec3b>(y, x) = cv::Vec3b(static_cast<uint8_t>(255 * x / cols), static_cast<uint8_t>(255 * y / rows),
                                            static_cast<uint8_t>(128 + 100 * std::sin((x + y) * 0.01 + seed)));
    }
  }
  cv::RNG rng(seed);
  for (int i = 0; i < 6; ++i) {
    cv::ellipse(image, cv::Point(rng.uniform(0, cols), rng.uniform(0, rows)),
                cv::Size(rng.uniform(10, cols / 3), rng.uniform(10, rows / 3)), rng.uniform(0, 180), 0, 360,
                cv::Scalar(rng.uniform(0, 256), rng.uniform(0, 256), rng.uniform(0, 256)), cv::FILLED);
  }
  cv::GaussianBlur(image, image, cv::Size(0, 0), 3);
  cv::Mat noise(rows, cols, CV_8UC3);
  rng.fill(noise, cv::RNG::NORMAL, 0, 6);
  image += noise;
  if (grey) cv::cvtColor(image, image, cv::COLOR_BGR2GRAY);
  std::vector<uint8_t> bytes;
  cv::imencode(".jpg", image, bytes, {cv::IMWRITE_JPEG_QUALITY, 90});
  return {bytes.begin(), bytes.end()};
}

// Largest and mean absolute difference of two images of one size.
std::pair<int, double> pixel_diff(const RawImage& a, const RawImage& b) {
  EXPECT_EQ(a.height, b.height);
  EXPECT_EQ(a.width, b.width);
  EXPECT_EQ(a.channels, b.channels);
  if (a.pixels.size() != b.pixels.size()) return {255, 255.0};
  int largest = 0;
  double sum = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) {
    const int d = std::abs(int{a.pixels[i]} - int{b.pixels[i]});
    largest = std::max(largest, d);
    sum += d;
  }
  return {largest, sum / static_cast<double>(a.pixels.size())};
}

TEST(JpegWindow, FullScaleWindowsMatchTheWholeDecode) {
  for (const bool grey : {false, true}) {
    const std::string jpeg = photo_jpeg(375, 500, 3, grey);
    const auto size = jpeg_size(jpeg);
    ASSERT_TRUE(size);
    EXPECT_EQ(size->height, 375);
    EXPECT_EQ(size->width, 500);
    EXPECT_EQ(size->channels, grey ? 1 : 3);
    const RawImage whole = decode_image_bytes(jpeg, "photo.jpg");
    for (const ImageWindow window : {ImageWindow{0, 0, 375, 500}, ImageWindow{37, 101, 200, 150},
                                     ImageWindow{200, 3, 175, 497}, ImageWindow{1, 490, 9, 10}}) {
      const RawImage part = decode_jpeg_window(jpeg, "photo.jpg", window, 1);
      const auto [largest, mean] =
          pixel_diff(part, crop_image(whole, window.top, window.left, window.height, window.width));
      std::cout << (grey ? "grey" : "colour") << " window " << window.height << "x" << window.width << " at ("
                << window.top << ", " << window.left << "): max |d| " << largest << ", mean " << mean << "\n";
      // libjpeg's smooth chroma upsampling reads one neighbouring column outside a cropped window differently.
      EXPECT_LE(largest, 3);
      EXPECT_LT(mean, 0.05);
    }
  }
}

TEST(JpegWindow, ReducedScalesMatchLibjpegsScaledWholeDecode) {
  const std::string jpeg = photo_jpeg(1500, 2000, 5);
  const cv::Mat encoded(1, static_cast<int>(jpeg.size()), CV_8UC1, const_cast<char*>(jpeg.data()));
  for (const int scale : {2, 4, 8}) {
    const int flag = scale == 2 ? cv::IMREAD_REDUCED_COLOR_2 : scale == 4 ? cv::IMREAD_REDUCED_COLOR_4
                                                                          : cv::IMREAD_REDUCED_COLOR_8;
    cv::Mat reduced = cv::imdecode(encoded, flag);
    cv::cvtColor(reduced, reduced, cv::COLOR_BGR2RGB);
    RawImage whole{reduced.rows, reduced.cols, 3, std::vector<uint8_t>(reduced.data, reduced.data + reduced.total() * 3)};
    EXPECT_EQ(whole.height, (1500 + scale - 1) / scale);
    const ImageWindow window{333, 517, 801, 1203};
    const RawImage part = decode_jpeg_window(jpeg, "big.jpg", window, scale);
    // Rows [floor(333/s), ceil(1134/s)), columns [floor(517/s), ceil(1720/s)).
    const int top = 333 / scale, left = 517 / scale;
    const int bottom = (1134 + scale - 1) / scale, right = (1720 + scale - 1) / scale;
    ASSERT_EQ(part.height, bottom - top);
    ASSERT_EQ(part.width, right - left);
    const auto [largest, mean] = pixel_diff(part, crop_image(whole, top, left, bottom - top, right - left));
    std::cout << "scale 1/" << scale << ": window " << part.height << "x" << part.width << ", max |d| " << largest
              << ", mean " << mean << "\n";
    EXPECT_LE(largest, 3);
    EXPECT_LT(mean, 0.05);
  }
  EXPECT_NE(error_of([&] { decode_jpeg_window(jpeg, "big.jpg", {1400, 0, 200, 10}, 2); }).find("big.jpg: window"),
            std::string::npos);
  EXPECT_NE(error_of([&] { decode_jpeg_window(jpeg.substr(0, jpeg.size() / 2), "cut.jpg", {0, 0, 8, 8}, 2); })
                .find("cut.jpg: truncated JPEG"),
            std::string::npos);
  EXPECT_FALSE(jpeg_size("\x89PNG\r\n\x1A\n...."));
}

TEST(ReducedDecode, ChoosesTheLargestReductionThatCoversTheOutput) {
  EXPECT_EQ(reduced_decode_scale(1500, 2000, 224, 224), 4);  // 1500 / 8 = 187 < 224
  EXPECT_EQ(reduced_decode_scale(1792, 1800, 224, 224), 8);
  EXPECT_EQ(reduced_decode_scale(1791, 1800, 224, 224), 4);
  EXPECT_EQ(reduced_decode_scale(448, 900, 224, 224), 2);
  EXPECT_EQ(reduced_decode_scale(447, 900, 224, 224), 1);
  EXPECT_EQ(reduced_decode_scale(375, 500, 224, 224), 1);
}

TEST(ReducedDecode, AugmentedBatchesMatchFullDecoding) {
  // The training transform on 2000x1500 JPEGs with and without reduced decoding: the same crops (the same RNG draws
  // on the same size), decoded at 1/2..1/8 or whole, then resized to 64x64. Per-image statistics agree closely.
  DataConfig data;
  data.preprocess.interpolation = Interpolation::bilinear;
  data.augment.random_resized_crop = true;
  data.augment.hflip = 0.5;
  const ModelConfig model = test::input_model(64, 64, 3);
  data.reduced_decode = true;
  const SampleTransform reduced = make_train_transform(data, model);
  data.reduced_decode = false;
  const SampleTransform full = make_train_transform(data, model);
  const auto codec = image_codec();
  std::vector<torch::Tensor> a, b;
  for (uint64_t i = 0; i < 6; ++i) {
    const std::string jpeg = photo_jpeg(1500, 2000, 10 + i);
    for (uint64_t draw = 0; draw < 4; ++draw) {
      std::mt19937_64 rng_a(100 * i + draw), rng_b(100 * i + draw);
      a.push_back(reduced(ImageInput(jpeg, "p.jpg", codec), rng_a));
      b.push_back(full(ImageInput(jpeg, "p.jpg", codec), rng_b));
    }
  }
  const torch::Tensor x = torch::stack(a), y = torch::stack(b);  // (24, 3, 64, 64), normalised
  const double mean_diff = (x.mean() - y.mean()).abs().item<double>();
  const double std_ratio = (x.std() / y.std()).item<double>();
  const double pixel = (x - y).abs().mean().item<double>();
  std::cout << "reduced vs full decoding over 24 crops: |mean diff| " << mean_diff << ", std ratio " << std_ratio
            << ", mean |pixel diff| " << pixel << " (normalised units)\n";
  EXPECT_LT(mean_diff, 0.01);
  EXPECT_NEAR(std_ratio, 1.0, 0.02);
  EXPECT_LT(pixel, 0.05);  // the same crops: only resampling differs
  // Per-channel means of each crop agree too.
  const torch::Tensor per_crop = (x.mean({2, 3}) - y.mean({2, 3})).abs().max();
  EXPECT_LT(per_crop.item<double>(), 0.03);
}

}  // namespace
}  // namespace vit
