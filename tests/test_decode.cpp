// Image decoding through OpenCV (src/image/decode.h): channels and bit depths in RGB order, a reference image read
// independently, and broken files failing with one line that names the file.
#include <gtest/gtest.h>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include "image/decode.h"
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
  expect_error(dir / "text.jpg", "not a decodable image (format not recognised or corrupt)");

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

}  // namespace
}  // namespace vit
