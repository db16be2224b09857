// The IDX (MNIST, Fashion-MNIST), CIFAR and CSV-list readers of src/data/dataset.h on generated files and fuzzer
// reproducers, their errors, the validation and subset splits, and the seeded random helpers every split and loader
// order is built on.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <set>

#include "data/dataset.h"
#include "test_util.h"
#include "util/fs.h"

namespace vit {
namespace {

using test::TempDir;
using test::dataset_config;
using test::error_of;
using test::write_bytes;

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  gzclose(file);
}

std::string big_endian32(uint32_t value) {
  return {static_cast<char>(value >> 24), static_cast<char>(value >> 16), static_cast<char>(value >> 8),
          static_cast<char>(value)};
}

// Image i has pixel p = (i * 7 + p) mod 256.
std::string idx_images(int64_t count, int64_t rows, int64_t cols, uint32_t magic = 0x00000803) {
  std::string bytes = big_endian32(magic) + big_endian32(count) + big_endian32(rows) + big_endian32(cols);
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t p = 0; p < rows * cols; ++p) bytes.push_back(static_cast<char>((i * 7 + p) % 256));
  }
  return bytes;
}

// Label i is i mod 10.
std::string idx_labels(int64_t count, uint32_t magic = 0x00000801) {
  std::string bytes = big_endian32(magic) + big_endian32(count);
  for (int64_t i = 0; i < count; ++i) bytes.push_back(static_cast<char>(i % 10));
  return bytes;
}

// An MNIST-style root: raw train files, gzipped t10k files.
void write_mnist(const TempDir& dir, int64_t train_count, int64_t test_count) {
  write_bytes(dir / "train-images-idx3-ubyte", idx_images(train_count, 4, 3));
  write_bytes(dir / "train-labels-idx1-ubyte", idx_labels(train_count));
  write_gz(dir / "t10k-images-idx3-ubyte.gz", idx_images(test_count, 4, 3));
  write_gz(dir / "t10k-labels-idx1-ubyte.gz", idx_labels(test_count));
}

// CIFAR records: label bytes, then planes R, G, B with value (record * 3 + plane * 50 + pixel) mod 256.
std::string cifar_records(int64_t count, int64_t label_bytes, int64_t first_label) {
  std::string bytes;
  for (int64_t r = 0; r < count; ++r) {
    for (int64_t b = 0; b < label_bytes; ++b) bytes.push_back(static_cast<char>((first_label + r + b) % 10));
    for (int64_t plane = 0; plane < 3; ++plane) {
      for (int64_t p = 0; p < 1024; ++p) bytes.push_back(static_cast<char>((r * 3 + plane * 50 + p) % 256));
    }
  }
  return bytes;
}

// Opening the MNIST root `dir` fails with a message that names `file` in it and says `what`.
void expect_open_error(const TempDir& dir, const std::string& file, const std::string& what) {
  const std::string message = error_of([&] { open_datasets(dataset_config("mnist", dir.path()), 0, {}); });
  EXPECT_NE(message.find(dir / file), std::string::npos) << message;
  EXPECT_NE(message.find(what), std::string::npos) << message;
}

TEST(DatasetIdx, ReadsRawAndGzip) {
  TempDir dir;
  write_mnist(dir, 25, 12);
  const Splits splits = open_datasets(dataset_config("mnist", dir.path()), 0, {});
  ASSERT_EQ(splits.train->size(), 25);
  ASSERT_EQ(splits.test->size(), 12);
  EXPECT_EQ(splits.val, splits.test);
  const Sample sample = splits.train->get(3);
  EXPECT_EQ(sample.image.height, 4);
  EXPECT_EQ(sample.image.width, 3);
  EXPECT_EQ(sample.image.channels, 1);
  for (int64_t p = 0; p < 12; ++p) EXPECT_EQ(sample.image.pixels[p], (3 * 7 + p) % 256);
  EXPECT_EQ(sample.label, 3);
  EXPECT_EQ(splits.test->get(11).label, 1);
  EXPECT_EQ(splits.test->label(11), 1);
  EXPECT_EQ(splits.train->class_names(), (std::vector<std::string>{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}));
  EXPECT_EQ(splits.train->source(3), dir / "train-images-idx3-ubyte#3");
  EXPECT_EQ(splits.test->source(0), dir / "t10k-images-idx3-ubyte.gz#0");
}

TEST(DatasetIdx, FashionMnistClassNames) {
  TempDir dir;
  write_mnist(dir, 10, 10);
  DataConfig config = dataset_config("mnist", dir.path());
  config.format = DataFormat::fashion_mnist;
  const Splits splits = open_datasets(config, 0, {});
  ASSERT_EQ(splits.train->class_names().size(), 10u);
  EXPECT_EQ(splits.train->class_names()[0], "T-shirt/top");
  EXPECT_EQ(splits.train->class_names()[9], "Ankle boot");
}

TEST(DatasetIdx, BadMagicNamesTheFile) {
  TempDir dir;
  write_mnist(dir, 5, 5);
  write_bytes(dir / "train-images-idx3-ubyte", idx_images(5, 4, 3, 0x00000801));
  expect_open_error(dir, "train-images-idx3-ubyte", "bad IDX magic 0x00000801");
}

TEST(DatasetIdx, TruncatedImagesNameTheFile) {
  TempDir dir;
  write_mnist(dir, 5, 5);
  std::string images = idx_images(5, 4, 3);
  images.resize(images.size() - 7);
  write_bytes(dir / "train-images-idx3-ubyte", images);
  expect_open_error(dir, "train-images-idx3-ubyte", "truncated");
}

TEST(DatasetIdx, CountMismatchNamesTheFile) {
  TempDir dir;
  write_mnist(dir, 5, 5);
  write_gz(dir / "t10k-labels-idx1-ubyte.gz", idx_labels(4));
  expect_open_error(dir, "t10k-labels-idx1-ubyte.gz", "4 labels");
}

TEST(DatasetIdx, LabelOutOfRange) {
  TempDir dir;
  write_mnist(dir, 5, 5);
  std::string labels = idx_labels(5);
  labels[8 + 2] = 10;
  write_bytes(dir / "train-labels-idx1-ubyte", labels);
  expect_open_error(dir, "train-labels-idx1-ubyte", "label 10");
}

// Found by fuzz_datasets (tests/data/fuzz/fuzz_datasets/idx_size_overflow: its part A is an image-file header of
// 41419 images of 3537494247x3998941697): the size product passed 2^63 (signed overflow, UBSan) and could wrap round
// onto the real file size. Now refused by the header alone.
TEST(DatasetIdx, HeaderBeyondAnyFileIsRefused) {
  TempDir dir;
  write_mnist(dir, 5, 3);
  // The fuzzer's input: a mode byte, the length of part A (u16, little-endian, cut to what is there), part A.
  const std::string input = read_file(test::data_path("fuzz/fuzz_datasets/idx_size_overflow"));
  const size_t length = std::min<size_t>(static_cast<uint8_t>(input[1]) | static_cast<uint8_t>(input[2]) << 8,
                                         input.size() - 3);
  write_bytes(dir / "train-images-idx3-ubyte", input.substr(3, length));
  expect_open_error(dir, "train-images-idx3-ubyte", "header declares 41419 images of 3537494247x3998941697, more than "
                                                    "any file holds");
  write_bytes(dir / "train-images-idx3-ubyte",
              big_endian32(0x803) + big_endian32(0xffffffffu) + big_endian32(0xffffffffu) + big_endian32(0xffffffffu));
  expect_open_error(dir, "train-images-idx3-ubyte", "more than any file holds");
  write_bytes(dir / "train-images-idx3-ubyte", idx_images(5, 0, 3));
  expect_open_error(dir, "train-images-idx3-ubyte", "images of 0x3 pixels");
}

// A small .gz that expands far beyond what its header declares (a decompression bomb) is read only as far as the
// header says, plus one byte to tell that it holds more.
TEST(DatasetIdx, GzipExpandingBeyondItsHeaderIsReadOnlyThatFar) {
  TempDir dir;
  write_mnist(dir, 5, 3);
  write_gz(dir / "t10k-images-idx3-ubyte.gz", idx_images(3, 4, 3) + std::string(64 << 20, '\0'));
  expect_open_error(dir, "t10k-images-idx3-ubyte.gz", "more than 52 bytes, expected 52 for 3 images of 4x3");
}

TEST(DatasetIdx, MissingFileSaysWhatWasLookedFor) {
  TempDir dir;
  const std::string message = error_of([&] { open_datasets(dataset_config("mnist", dir.path()), 0, {}); });
  EXPECT_NE(message.find("train-images-idx3-ubyte.gz"), std::string::npos) << message;
}

TEST(DatasetCifar, Cifar10PlanarToHwc) {
  TempDir dir;
  for (int i = 1; i <= 5; ++i) write_bytes(dir / ("data_batch_" + std::to_string(i) + ".bin"), cifar_records(2, 1, i));
  write_bytes(dir / "test_batch.bin", cifar_records(3, 1, 0));
  write_bytes(dir / "batches.meta.txt", "a0\na1\na2\na3\na4\na5\na6\na7\na8\na9\n\n");
  const DataConfig config = dataset_config("cifar10", dir.path());
  const Splits splits = open_datasets(config, 0, {});
  ASSERT_EQ(splits.train->size(), 10);
  ASSERT_EQ(splits.test->size(), 3);
  EXPECT_EQ(splits.train->class_names()[3], "a3");
  // Train sample 7 is record 1 of data_batch_4.
  const Sample sample = splits.train->get(7);
  EXPECT_EQ(sample.label, (4 + 1) % 10);
  ASSERT_EQ(sample.image.height, 32);
  ASSERT_EQ(sample.image.channels, 3);
  for (int64_t y : {0, 5, 31}) {
    for (int64_t x : {0, 17, 31}) {
      for (int64_t c = 0; c < 3; ++c) {
        EXPECT_EQ(sample.image.pixels[(y * 32 + x) * 3 + c], (1 * 3 + c * 50 + y * 32 + x) % 256);
      }
    }
  }
  EXPECT_EQ(splits.train->source(7), dir / "data_batch_4.bin#1");
}

TEST(DatasetCifar, Cifar10DefaultNames) {
  TempDir dir;
  for (int i = 1; i <= 5; ++i) write_bytes(dir / ("data_batch_" + std::to_string(i) + ".bin"), cifar_records(1, 1, 0));
  write_bytes(dir / "test_batch.bin", cifar_records(1, 1, 0));
  const DataConfig config = dataset_config("cifar10", dir.path());
  const Splits splits = open_datasets(config, 0, {});
  EXPECT_EQ(splits.train->class_names()[0], "airplane");
  EXPECT_EQ(splits.train->class_names()[9], "truck");
}

TEST(DatasetCifar, Cifar100FineLabels) {
  TempDir dir;
  write_bytes(dir / "train.bin", cifar_records(4, 2, 0));  // (coarse, fine) = (r, r + 1)
  write_bytes(dir / "test.bin", cifar_records(2, 2, 5));
  const DataConfig config = dataset_config("cifar100", dir.path());
  Splits splits = open_datasets(config, 0, {});
  ASSERT_EQ(splits.train->size(), 4);
  EXPECT_EQ(splits.train->label(2), 3);
  EXPECT_EQ(splits.test->get(1).label, 7);
  ASSERT_EQ(splits.train->class_names().size(), 100u);
  EXPECT_EQ(splits.train->class_names()[42], "42");

  std::string names;
  for (int i = 0; i < 100; ++i) names += "fine" + std::to_string(i) + "\n";
  write_bytes(dir / "fine_label_names.txt", names);
  splits = open_datasets(config, 0, {});
  EXPECT_EQ(splits.train->class_names()[42], "fine42");
}

TEST(DatasetCifar, TruncatedBatchNamesFileSizeAndRecord) {
  TempDir dir;
  for (int i = 1; i <= 5; ++i) write_bytes(dir / ("data_batch_" + std::to_string(i) + ".bin"), cifar_records(2, 1, 0));
  std::string test = cifar_records(2, 1, 0);
  test.resize(test.size() - 100);
  write_bytes(dir / "test_batch.bin", test);
  const DataConfig config = dataset_config("cifar10", dir.path());
  const std::string message = error_of([&] { open_datasets(config, 0, {}); });
  EXPECT_NE(message.find(dir / "test_batch.bin"), std::string::npos) << message;
  EXPECT_NE(message.find(std::to_string(test.size())), std::string::npos) << message;
  EXPECT_NE(message.find("3073"), std::string::npos) << message;
}

TEST(DatasetSplits, ValFractionIsDeterministicAndDisjoint) {
  TempDir dir;
  write_mnist(dir, 100, 10);
  DataConfig config = dataset_config("mnist", dir.path());
  config.val_fraction = 0.2;
  const Splits a = open_datasets(config, 7, {});
  const Splits b = open_datasets(config, 7, {});
  const Splits c = open_datasets(config, 8, {});
  ASSERT_EQ(a.train->size(), 80);
  ASSERT_EQ(a.val->size(), 20);
  EXPECT_EQ(a.test->size(), 10);  // the format's test split stays the test set
  std::set<std::string> seen;
  for (int64_t i = 0; i < a.train->size(); ++i) seen.insert(a.train->source(i));
  for (int64_t i = 0; i < a.val->size(); ++i) EXPECT_TRUE(seen.insert(a.val->source(i)).second);
  EXPECT_EQ(seen.size(), 100u);
  std::vector<std::string> val_a, val_b, val_c;
  for (int64_t i = 0; i < 20; ++i) {
    val_a.push_back(a.val->source(i));
    val_b.push_back(b.val->source(i));
    val_c.push_back(c.val->source(i));
    EXPECT_EQ(a.val->get(i).label, a.val->label(i));
  }
  EXPECT_EQ(val_a, val_b);
  EXPECT_NE(val_a, val_c);
}

TEST(DatasetSplits, SubsetsTakeASeededSample) {
  TempDir dir;
  write_mnist(dir, 50, 30);
  DataConfig config = dataset_config("mnist", dir.path());
  config.train_subset = 10;
  config.val_subset = 5;
  const Splits a = open_datasets(config, 1, {});
  const Splits b = open_datasets(config, 1, {});
  ASSERT_EQ(a.train->size(), 10);
  ASSERT_EQ(a.val->size(), 5);
  EXPECT_EQ(a.test->size(), 30);
  bool natural = true;
  for (int64_t i = 0; i < 10; ++i) {
    EXPECT_EQ(a.train->source(i), b.train->source(i));
    natural = natural && a.train->source(i) == dir / ("train-images-idx3-ubyte#" + std::to_string(i));
  }
  EXPECT_FALSE(natural) << "a subset should be a shuffled pick, not the first N";
}

TEST(DatasetFormat, ErrorsNameTheProblem) {
  DataConfig config;  // an unknown format is refused by the parser (ConfigEnums)
  config.format = DataFormat::folder;
  config.root = "/nonexistent";
  EXPECT_NE(error_of([&] { open_datasets(config, 0, {}); }).find("built without OpenCV"), std::string::npos);
  config.format = DataFormat::csv;
  EXPECT_NE(error_of([&] { open_datasets(config, 0, {}); }).find("built without OpenCV"), std::string::npos);
}

// A CSV list only holds paths (nothing is decoded here, so a codec that is never called will do). One stray huge
// integer label used to number a billion classes ("0".."999999999") before anything else was checked.
TEST(DatasetCsv, HugeIntegerLabelIsRefusedBeforeNumberingClasses) {
  TempDir dir;
  write_bytes(dir / "train.csv", "a.png,0\nb.png,999999999\n");
  write_bytes(dir / "val.csv", "a.png,0\n");
  DataConfig config;
  config.format = DataFormat::csv;
  config.train_csv = dir / "train.csv";
  config.val_csv = dir / "val.csv";
  const std::string message = error_of([&] { open_datasets(config, 0, std::make_shared<ImageCodec>()); });
  EXPECT_EQ(message, dir / "train.csv" + ":2: label 999999999 makes 1000000000 numbered classes, more than 1048576");
}

TEST(DatasetRandom, PermutationIsFixedAcrossPlatforms) {
  // Our own Fisher-Yates on mt19937_64: this exact order must never change, or resumed runs would diverge.
  const std::vector<int64_t> order = seeded_permutation(10, 42);
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(sorted[i], i);
  EXPECT_EQ(order, seeded_permutation(10, 42));
  EXPECT_NE(order, seeded_permutation(10, 43));
  std::mt19937_64 rng(5);
  for (int i = 0; i < 1000; ++i) {
    const double u = uniform01(rng);
    ASSERT_TRUE(u >= 0.0 && u < 1.0);
    const int64_t k = uniform_int(rng, 7);
    ASSERT_TRUE(k >= 0 && k < 7);
  }
  EXPECT_NE(mix_seed({1, 2}), mix_seed({2, 1}));
}

}  // namespace
}  // namespace vit
