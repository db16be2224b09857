// The folder and CSV datasets (src/data/dataset.h) over real image files decoded through OpenCV: class folders,
// CSV labels, their errors, the held-out split, and the loader skipping a corrupt file.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <torch/torch.h>

#include "data/augment.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "image/decode.h"
#include "test_util.h"

namespace vit {
namespace {

namespace stdfs = std::filesystem;

using test::TempDir;
using test::dataset_config;
using test::error_of;
using test::write_bytes;

// Writes an 8-bit BGR image whose colour encodes `value`, creating parent folders.
void write_png(const std::string& path, int value, int size = 6) {
  stdfs::create_directories(stdfs::path(path).parent_path());
  const cv::Mat image(size, size, CV_8UC3, cv::Scalar(value, value + 1, value + 2));
  ASSERT_TRUE(cv::imwrite(path, image)) << path;
}

// ---------------------------------------------------------------- folder datasets

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
  const Splits splits = open_datasets(dataset_config("folder", dir.path()), 0, image_codec());
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
  const std::string message = error_of([&] { open_datasets(dataset_config("folder", dir.path()), 0, image_codec()); });
  EXPECT_NE(message.find(dir / "train/dog"), std::string::npos) << message;
  EXPECT_NE(message.find("no images"), std::string::npos) << message;
}

TEST(FolderDataset, ValClassesMustMatchTrain) {
  TempDir dir;
  write_png(dir / "train/cat/a.png", 1);
  write_png(dir / "train/dog/a.png", 1);
  write_png(dir / "val/cat/a.png", 1);
  write_png(dir / "val/cow/a.png", 1);
  const std::string message = error_of([&] { open_datasets(dataset_config("folder", dir.path()), 0, image_codec()); });
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
  DataConfig config = dataset_config("folder", dir.path());
  config.val_fraction = 0.25;
  const Splits a = open_datasets(config, 3, image_codec());
  const Splits b = open_datasets(config, 3, image_codec());
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
  const Splits splits = open_datasets(dataset_config("folder", dir.path()), 0, image_codec());
  DataConfig data;
  const ModelConfig model = test::input_model(4, 4, 3);
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
  config.format = DataFormat::csv;
  config.train_csv = dir / "train.csv";
  config.val_csv = dir / "val.csv";
  const Splits splits = open_datasets(config, 0, image_codec());
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
  config.format = DataFormat::csv;
  config.train_csv = dir / "train.csv";
  config.val_csv = dir / "val.csv";
  std::string message = error_of([&] { open_datasets(config, 0, image_codec()); });
  EXPECT_NE(message.find(dir / "val.csv" + ":2: unknown label \"7\""), std::string::npos) << message;

  write_bytes(dir / "val.csv", "a.png,2\n");
  const Splits splits = open_datasets(config, 0, image_codec());
  EXPECT_EQ(splits.train->class_names(), (std::vector<std::string>{"0", "1", "2", "3"}));
  EXPECT_EQ(splits.val->label(0), 2);

  write_bytes(dir / "train.csv", "a.png,cat\n");
  write_bytes(dir / "val.csv", "path,label\na.png,cat\na.png,unicorn\n");
  message = error_of([&] { open_datasets(config, 0, image_codec()); });
  EXPECT_NE(message.find(dir / "val.csv" + ":3: unknown label \"unicorn\""), std::string::npos) << message;
}

}  // namespace
}  // namespace vit
