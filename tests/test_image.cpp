// Vision library tests: OpenCV decoding (channels, depths, broken files), folder and CSV datasets decoding through
// it, the loader skipping a corrupt file, and RandAugment.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <torch/torch.h>

#include "data/augment.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "image/decode.h"
#include "image/randaugment.h"
#include "util/fs.h"
#include "test_util.h"

namespace vit {
namespace {

namespace stdfs = std::filesystem;

using test::TempDir;
using test::error_of;
using test::write_bytes;

// Writes an 8-bit BGR image whose colour encodes `value`, creating parent folders.
void write_png(const std::string& path, int value, int size = 6) {
  stdfs::create_directories(stdfs::path(path).parent_path());
  const cv::Mat image(size, size, CV_8UC3, cv::Scalar(value, value + 1, value + 2));
  ASSERT_TRUE(cv::imwrite(path, image)) << path;
}

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

// ---------------------------------------------------------------- decoding

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

// ---------------------------------------------------------------- folder datasets

DataConfig folder_config(const TempDir& dir) {
  DataConfig config;
  config.format = "folder";
  config.root = dir.path();
  return config;
}

TEST(FolderDataset, ClassesAreSortedSubfolders) {
  TempDir dir;
  for (const std::string split : {"train", "val"}) {
    write_png(dir / (split + "/zebra/a.png"), 10);
    write_png(dir / (split + "/ant/b.png"), 20);
    write_png(dir / (split + "/ant/nested/c.png"), 30);
    write_png(dir / (split + "/mid/d.png"), 40);
  }
  write_bytes(dir / "train/ant/notes.txt", "not an image");
  write_png(dir / "train/.hidden/e.png", 50);
  const Splits splits = open_datasets(folder_config(dir), 0, decode_image);
  EXPECT_EQ(splits.train->class_names(), (std::vector<std::string>{"ant", "mid", "zebra"}));
  ASSERT_EQ(splits.train->size(), 4);
  EXPECT_EQ(splits.val->size(), 4);
  EXPECT_EQ(splits.test, splits.val);
  EXPECT_EQ(splits.train->source(0), dir / "train/ant/b.png");
  EXPECT_EQ(splits.train->label(0), 0);
  EXPECT_EQ(splits.train->source(1), dir / "train/ant/nested/c.png");
  EXPECT_EQ(splits.train->label(3), 2);
  const Sample sample = splits.train->get(3);
  EXPECT_EQ(sample.label, 2);
  ASSERT_EQ(sample.image.channels, 3);
  EXPECT_EQ(sample.image.pixels[0], 12);  // BGR (10, 11, 12) written, RGB read
}

TEST(FolderDataset, EmptyClassFolderIsAnError) {
  TempDir dir;
  write_png(dir / "train/cat/a.png", 1);
  stdfs::create_directories(dir / "train/dog");
  write_png(dir / "val/cat/a.png", 1);
  const std::string message = error_of([&] { open_datasets(folder_config(dir), 0, decode_image); });
  EXPECT_NE(message.find(dir / "train/dog"), std::string::npos) << message;
  EXPECT_NE(message.find("no images"), std::string::npos) << message;
}

TEST(FolderDataset, ValClassesMustMatchTrain) {
  TempDir dir;
  write_png(dir / "train/cat/a.png", 1);
  write_png(dir / "train/dog/a.png", 1);
  write_png(dir / "val/cat/a.png", 1);
  write_png(dir / "val/cow/a.png", 1);
  const std::string message = error_of([&] { open_datasets(folder_config(dir), 0, decode_image); });
  EXPECT_NE(message.find(dir / "val"), std::string::npos) << message;
  EXPECT_NE(message.find("[cat, cow]"), std::string::npos) << message;
  EXPECT_NE(message.find("[cat, dog]"), std::string::npos) << message;
}

TEST(FolderDataset, ValFractionSplitIsDeterministicAndDisjoint) {
  TempDir dir;
  for (int i = 0; i < 10; ++i) {
    write_png(dir / ("cat/" + std::to_string(i) + ".png"), i);
    write_png(dir / ("dog/" + std::to_string(i) + ".png"), i);
  }
  DataConfig config = folder_config(dir);
  config.val_fraction = 0.25;
  const Splits a = open_datasets(config, 3, decode_image);
  const Splits b = open_datasets(config, 3, decode_image);
  ASSERT_EQ(a.train->size(), 15);
  ASSERT_EQ(a.val->size(), 5);
  EXPECT_EQ(a.test, a.val);  // no val folder: the held-out part is also the test set
  std::set<std::string> all;
  for (int64_t i = 0; i < 15; ++i) all.insert(a.train->source(i));
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_TRUE(all.insert(a.val->source(i)).second);
    EXPECT_EQ(a.val->source(i), b.val->source(i));
  }
  EXPECT_EQ(all.size(), 20u);
}

TEST(FolderDataset, LoaderSkipsACorruptImage) {
  TempDir dir;
  for (int i = 0; i < 6; ++i) write_png(dir / ("train/a/" + std::to_string(i) + ".png"), i);
  write_bytes(dir / "train/a/3.png", "corrupt");
  write_png(dir / "val/a/0.png", 0);
  const Splits splits = open_datasets(folder_config(dir), 0, decode_image);
  DataConfig data;
  ModelConfig model;
  model.img_h = model.img_w = 4;
  model.in_chans = 3;
  LoaderOptions options;
  options.batch_size = 4;
  options.drop_last = false;
  options.shuffle = false;
  options.skip_bad_images = true;
  Loader loader(splits.train, make_eval_transform(data, model), options);
  loader.start_epoch(0);
  int64_t rows = 0;
  while (auto batch = loader.next()) {
    EXPECT_EQ(batch->images.sizes().slice(1), (torch::IntArrayRef{3, 4, 4}));
    rows += batch->images.size(0);
  }
  EXPECT_EQ(rows, 5);
  EXPECT_EQ(loader.bad_images(), (std::vector<std::string>{dir / "train/a/3.png"}));

  options.skip_bad_images = false;
  Loader strict(splits.train, make_eval_transform(data, model), options);
  strict.start_epoch(0);
  const std::string message = error_of([&] {
    while (strict.next()) {
    }
  });
  EXPECT_NE(message.find(dir / "train/a/3.png"), std::string::npos) << message;
}

// ---------------------------------------------------------------- CSV datasets

TEST(CsvDataset, NamedLabelsWithHeader) {
  TempDir dir;
  write_png(dir / "img/a.png", 1);
  write_png(dir / "img/b.png", 2);
  write_png(dir / "img/c.png", 3);
  write_bytes(dir / "train.csv", "path,label\nimg/a.png,dog\nimg/b.png,cat\r\n\nimg/c.png,dog\n");
  write_bytes(dir / "val.csv", "img/c.png,cat\n" + (dir / "img/a.png") + ",dog\n");
  DataConfig config;
  config.format = "csv";
  config.train_csv = dir / "train.csv";
  config.val_csv = dir / "val.csv";
  const Splits splits = open_datasets(config, 0, decode_image);
  EXPECT_EQ(splits.train->class_names(), (std::vector<std::string>{"cat", "dog"}));
  ASSERT_EQ(splits.train->size(), 3);
  EXPECT_EQ(splits.train->label(0), 1);
  EXPECT_EQ(splits.train->label(1), 0);
  EXPECT_EQ(splits.train->source(2), dir / "img/c.png");
  EXPECT_EQ(splits.val->label(0), 0);
  EXPECT_EQ(splits.val->source(1), dir / "img/a.png");
  EXPECT_EQ(splits.test, splits.val);
  EXPECT_EQ(splits.val->get(1).image.pixels[0], 3);
}

TEST(CsvDataset, IntegerLabelsAndUnknownLabels) {
  TempDir dir;
  write_png(dir / "a.png", 1);
  write_bytes(dir / "train.csv", "a.png,0\na.png,3\n");
  write_bytes(dir / "val.csv", "a.png,2\na.png,7\n");
  DataConfig config;
  config.format = "csv";
  config.train_csv = dir / "train.csv";
  config.val_csv = dir / "val.csv";
  std::string message = error_of([&] { open_datasets(config, 0, decode_image); });
  EXPECT_NE(message.find(dir / "val.csv" + ":2: unknown label \"7\""), std::string::npos) << message;

  write_bytes(dir / "val.csv", "a.png,2\n");
  const Splits splits = open_datasets(config, 0, decode_image);
  EXPECT_EQ(splits.train->class_names(), (std::vector<std::string>{"0", "1", "2", "3"}));
  EXPECT_EQ(splits.val->label(0), 2);

  write_bytes(dir / "train.csv", "a.png,cat\n");
  write_bytes(dir / "val.csv", "path,label\na.png,cat\na.png,unicorn\n");
  message = error_of([&] { open_datasets(config, 0, decode_image); });
  EXPECT_NE(message.find(dir / "val.csv" + ":3: unknown label \"unicorn\""), std::string::npos) << message;
}

// ---------------------------------------------------------------- RandAugment

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
  ModelConfig model;
  model.img_h = model.img_w = 16;
  model.in_chans = 3;
  const RawAugment randaugment = make_randaugment(data.augment.randaugment_ops, data.augment.randaugment_magnitude);
  const SampleTransform transform = make_train_transform(data, model, randaugment);
  const RawImage image = pattern_image(16, 16, 3);
  std::mt19937_64 a(4), b(4);
  EXPECT_TRUE(torch::equal(transform(image, a), transform(image, b)));
}

}  // namespace
}  // namespace vit
