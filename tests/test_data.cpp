// Core data pipeline tests: IDX/CIFAR readers on generated files, splits, the loader's determinism contract
// (workers, resume, sharding), augmentation and the shared preprocessing, all without OpenCV.
#include <gtest/gtest.h>
#include <zlib.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <ATen/Config.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "data/augment.h"
#include "data/dataset.h"
#include "data/image.h"
#include "data/loader.h"
#include "test_util.h"

namespace vit {
namespace {

using test::TempDir;
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

DataConfig mnist_config(const TempDir& dir) {
  DataConfig config;
  config.format = "mnist";
  config.root = dir.path();
  return config;
}

// ---------------------------------------------------------------- datasets

TEST(DatasetIdx, ReadsRawAndGzip) {
  TempDir dir;
  write_mnist(dir, 25, 12);
  const Splits splits = open_datasets(mnist_config(dir), 0, {});
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
  DataConfig config = mnist_config(dir);
  config.format = "fashion_mnist";
  const Splits splits = open_datasets(config, 0, {});
  ASSERT_EQ(splits.train->class_names().size(), 10u);
  EXPECT_EQ(splits.train->class_names()[0], "T-shirt/top");
  EXPECT_EQ(splits.train->class_names()[9], "Ankle boot");
}

TEST(DatasetIdx, BadMagicNamesTheFile) {
  TempDir dir;
  write_mnist(dir, 5, 5);
  write_bytes(dir / "train-images-idx3-ubyte", idx_images(5, 4, 3, 0x00000801));
  const std::string message = error_of([&] { open_datasets(mnist_config(dir), 0, {}); });
  EXPECT_NE(message.find(dir / "train-images-idx3-ubyte"), std::string::npos) << message;
  EXPECT_NE(message.find("bad IDX magic 0x00000801"), std::string::npos) << message;
}

TEST(DatasetIdx, TruncatedImagesNameTheFile) {
  TempDir dir;
  write_mnist(dir, 5, 5);
  std::string images = idx_images(5, 4, 3);
  images.resize(images.size() - 7);
  write_bytes(dir / "train-images-idx3-ubyte", images);
  const std::string message = error_of([&] { open_datasets(mnist_config(dir), 0, {}); });
  EXPECT_NE(message.find(dir / "train-images-idx3-ubyte"), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
}

TEST(DatasetIdx, CountMismatchNamesTheFile) {
  TempDir dir;
  write_mnist(dir, 5, 5);
  write_gz(dir / "t10k-labels-idx1-ubyte.gz", idx_labels(4));
  const std::string message = error_of([&] { open_datasets(mnist_config(dir), 0, {}); });
  EXPECT_NE(message.find(dir / "t10k-labels-idx1-ubyte.gz"), std::string::npos) << message;
  EXPECT_NE(message.find("4 labels"), std::string::npos) << message;
}

TEST(DatasetIdx, LabelOutOfRange) {
  TempDir dir;
  write_mnist(dir, 5, 5);
  std::string labels = idx_labels(5);
  labels[8 + 2] = 10;
  write_bytes(dir / "train-labels-idx1-ubyte", labels);
  const std::string message = error_of([&] { open_datasets(mnist_config(dir), 0, {}); });
  EXPECT_NE(message.find(dir / "train-labels-idx1-ubyte"), std::string::npos) << message;
  EXPECT_NE(message.find("label 10"), std::string::npos) << message;
}

TEST(DatasetIdx, MissingFileSaysWhatWasLookedFor) {
  TempDir dir;
  const std::string message = error_of([&] { open_datasets(mnist_config(dir), 0, {}); });
  EXPECT_NE(message.find("train-images-idx3-ubyte.gz"), std::string::npos) << message;
}

TEST(DatasetCifar, Cifar10PlanarToHwc) {
  TempDir dir;
  for (int i = 1; i <= 5; ++i) write_bytes(dir / ("data_batch_" + std::to_string(i) + ".bin"), cifar_records(2, 1, i));
  write_bytes(dir / "test_batch.bin", cifar_records(3, 1, 0));
  write_bytes(dir / "batches.meta.txt", "a0\na1\na2\na3\na4\na5\na6\na7\na8\na9\n\n");
  DataConfig config;
  config.format = "cifar10";
  config.root = dir.path();
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
  DataConfig config;
  config.format = "cifar10";
  config.root = dir.path();
  const Splits splits = open_datasets(config, 0, {});
  EXPECT_EQ(splits.train->class_names()[0], "airplane");
  EXPECT_EQ(splits.train->class_names()[9], "truck");
}

TEST(DatasetCifar, Cifar100FineLabels) {
  TempDir dir;
  write_bytes(dir / "train.bin", cifar_records(4, 2, 0));  // (coarse, fine) = (r, r + 1)
  write_bytes(dir / "test.bin", cifar_records(2, 2, 5));
  DataConfig config;
  config.format = "cifar100";
  config.root = dir.path();
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
  DataConfig config;
  config.format = "cifar10";
  config.root = dir.path();
  const std::string message = error_of([&] { open_datasets(config, 0, {}); });
  EXPECT_NE(message.find(dir / "test_batch.bin"), std::string::npos) << message;
  EXPECT_NE(message.find(std::to_string(test.size())), std::string::npos) << message;
  EXPECT_NE(message.find("3073"), std::string::npos) << message;
}

TEST(DatasetSplits, ValFractionIsDeterministicAndDisjoint) {
  TempDir dir;
  write_mnist(dir, 100, 10);
  DataConfig config = mnist_config(dir);
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
  DataConfig config = mnist_config(dir);
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
  DataConfig config;
  config.format = "imagenet";
  EXPECT_NE(error_of([&] { open_datasets(config, 0, {}); }).find("unknown data.format \"imagenet\""),
            std::string::npos);
  config.format = "folder";
  config.root = "/nonexistent";
  EXPECT_NE(error_of([&] { open_datasets(config, 0, {}); }).find("built without OpenCV"), std::string::npos);
  config.format = "csv";
  EXPECT_NE(error_of([&] { open_datasets(config, 0, {}); }).find("built without OpenCV"), std::string::npos);
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

// ---------------------------------------------------------------- loader

// Sample i is a 1x1x3 image holding i in base 256; it fails to decode when i is in `bad`.
class CountingDataset : public Dataset {
 public:
  explicit CountingDataset(int64_t count, std::set<int64_t> bad = {}) : count_(count), bad_(std::move(bad)) {}
  int64_t size() const override { return count_; }
  Sample get(int64_t index) const override {
    if (bad_.count(index)) throw std::runtime_error(source(index) + ": not a decodable image");
    Sample sample;
    sample.image = RawImage{1, 1, 3, {static_cast<uint8_t>(index & 255), static_cast<uint8_t>((index >> 8) & 255), 0}};
    sample.label = index % 10;
    return sample;
  }
  std::string source(int64_t index) const override { return "sample" + std::to_string(index) + ".png"; }
  int64_t label(int64_t index) const override { return index % 10; }
  const std::vector<std::string>& class_names() const override { return names_; }

 private:
  int64_t count_;
  std::set<int64_t> bad_;
  std::vector<std::string> names_ = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
};

// (2, 1, 1): the decoded index, and one draw from the per-sample RNG (shows the RNG is tied to the position).
torch::Tensor index_and_draw(RawImage image, std::mt19937_64& rng) {
  torch::Tensor out = torch::empty({2, 1, 1});
  out[0][0][0] = static_cast<float>(image.pixels[0] + 256 * image.pixels[1]);
  out[1][0][0] = static_cast<float>(uniform01(rng));
  return out;
}

std::vector<Batch> run_epoch(Loader& loader, int64_t epoch, int64_t first_batch = 0) {
  loader.start_epoch(epoch, first_batch);
  std::vector<Batch> batches;
  while (auto batch = loader.next()) batches.push_back(std::move(*batch));
  return batches;
}

void expect_same_batches(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].indices, b[i].indices) << "batch " << i;
    EXPECT_TRUE(torch::equal(a[i].images, b[i].images)) << "batch " << i;
    EXPECT_TRUE(torch::equal(a[i].labels, b[i].labels)) << "batch " << i;
  }
}

TEST(LoaderOrder, IdenticalForAnyNumberOfWorkers) {
  auto dataset = std::make_shared<CountingDataset>(103);
  std::vector<std::vector<Batch>> runs;
  for (int64_t workers : {0, 1, 3}) {
    LoaderOptions options;
    options.batch_size = 8;
    options.seed = 11;
    options.num_workers = workers;
    options.prefetch = 2;
    Loader loader(dataset, index_and_draw, options);
    EXPECT_EQ(loader.batches_per_epoch(), 12);
    runs.push_back(run_epoch(loader, 3));
  }
  expect_same_batches(runs[0], runs[1]);
  expect_same_batches(runs[0], runs[2]);
  std::set<int64_t> seen;
  for (const Batch& batch : runs[0]) {
    ASSERT_EQ(batch.images.sizes(), (torch::IntArrayRef{8, 2, 1, 1}));
    for (size_t row = 0; row < batch.indices.size(); ++row) {
      EXPECT_EQ(batch.images[row][0][0][0].item<float>(), static_cast<float>(batch.indices[row]));
      EXPECT_EQ(batch.labels[row].item<int64_t>(), batch.indices[row] % 10);
      EXPECT_TRUE(seen.insert(batch.indices[row]).second);
    }
  }
  EXPECT_EQ(seen.size(), 96u);  // drop_last: 103 - 103 % 8
}

TEST(LoaderOrder, ResumeMidEpochMatchesTheFullEpoch) {
  auto dataset = std::make_shared<CountingDataset>(100);
  LoaderOptions options;
  options.batch_size = 7;
  options.seed = 5;
  Loader loader(dataset, index_and_draw, options);
  const std::vector<Batch> full = run_epoch(loader, 2);
  // Abandon an epoch half-way (workers are busy), then resume the same epoch at batch 5.
  loader.start_epoch(9);
  ASSERT_TRUE(loader.next().has_value());
  const std::vector<Batch> resumed = run_epoch(loader, 2, 5);
  expect_same_batches(std::vector<Batch>(full.begin() + 5, full.end()), resumed);
  EXPECT_TRUE(run_epoch(loader, 2, loader.batches_per_epoch()).empty());
}

TEST(LoaderOrder, EpochsDifferAndNoShuffleIsNatural) {
  auto dataset = std::make_shared<CountingDataset>(40);
  LoaderOptions options;
  options.batch_size = 10;
  options.seed = 1;
  Loader loader(dataset, index_and_draw, options);
  const std::vector<Batch> epoch0 = run_epoch(loader, 0), epoch1 = run_epoch(loader, 1);
  EXPECT_NE(epoch0[0].indices, epoch1[0].indices);
  options.shuffle = false;
  Loader ordered(dataset, index_and_draw, options);
  const std::vector<Batch> batches = run_epoch(ordered, 4);
  ASSERT_EQ(batches.size(), 4u);
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(batches[2].indices[i], 20 + i);
}

TEST(LoaderShard, TwoRanksReproduceOneRankWithTheGlobalBatch) {
  auto dataset = std::make_shared<CountingDataset>(101);
  LoaderOptions single;
  single.batch_size = 8;
  single.seed = 3;
  Loader one(dataset, index_and_draw, single);
  const std::vector<Batch> global = run_epoch(one, 1);
  std::vector<std::vector<Batch>> ranks;
  for (int64_t rank = 0; rank < 2; ++rank) {
    LoaderOptions options = single;
    options.batch_size = 4;
    options.rank = rank;
    options.world_size = 2;
    Loader loader(dataset, index_and_draw, options);
    ranks.push_back(run_epoch(loader, 1));
  }
  ASSERT_EQ(global.size(), 12u);
  ASSERT_EQ(ranks[0].size(), global.size());
  ASSERT_EQ(ranks[1].size(), global.size());
  for (size_t k = 0; k < global.size(); ++k) {
    std::vector<int64_t> joined = ranks[0][k].indices;
    joined.insert(joined.end(), ranks[1][k].indices.begin(), ranks[1][k].indices.end());
    EXPECT_EQ(joined, global[k].indices);
    EXPECT_TRUE(torch::equal(torch::cat({ranks[0][k].images, ranks[1][k].images}), global[k].images));
  }
}

TEST(LoaderShard, EvaluationSeesEverySampleExactlyOnce) {
  for (int64_t world : {1, 3}) {
    auto dataset = std::make_shared<CountingDataset>(103);
    std::map<int64_t, int> seen;
    for (int64_t rank = 0; rank < world; ++rank) {
      LoaderOptions options;
      options.batch_size = 8;
      options.shuffle = false;
      options.drop_last = false;
      options.rank = rank;
      options.world_size = world;
      Loader loader(dataset, index_and_draw, options);
      int64_t batches = 0;
      for (const Batch& batch : run_epoch(loader, 0)) {
        ++batches;
        for (int64_t index : batch.indices) ++seen[index];
      }
      EXPECT_EQ(batches, loader.batches_per_epoch());
    }
    ASSERT_EQ(seen.size(), 103u) << "world " << world;
    for (const auto& [index, count] : seen) EXPECT_EQ(count, 1) << "index " << index;
  }
}

TEST(LoaderErrors, WorkerErrorsReachTheCaller) {
  auto dataset = std::make_shared<CountingDataset>(30, std::set<int64_t>{13});
  LoaderOptions options;
  options.batch_size = 5;
  options.shuffle = false;
  options.num_workers = 2;
  Loader loader(dataset, index_and_draw, options);
  loader.start_epoch(0);
  std::string message;
  int64_t good_batches = 0;
  try {
    while (loader.next()) ++good_batches;
  } catch (const std::exception& error) {
    message = error.what();
  }
  EXPECT_EQ(good_batches, 2);
  EXPECT_NE(message.find("sample13.png"), std::string::npos) << message;
}

TEST(LoaderErrors, SkipBadImagesDropsAndRecordsThem) {
  auto dataset = std::make_shared<CountingDataset>(30, std::set<int64_t>{4, 13, 14});
  LoaderOptions options;
  options.batch_size = 5;
  options.shuffle = false;
  options.drop_last = false;
  options.skip_bad_images = true;
  Loader loader(dataset, index_and_draw, options);
  std::set<int64_t> seen;
  for (const Batch& batch : run_epoch(loader, 0)) {
    EXPECT_EQ(batch.images.size(0), static_cast<int64_t>(batch.indices.size()));
    EXPECT_EQ(batch.labels.size(0), static_cast<int64_t>(batch.indices.size()));
    seen.insert(batch.indices.begin(), batch.indices.end());
  }
  EXPECT_EQ(seen.size(), 27u);
  EXPECT_EQ(seen.count(13), 0u);
  const std::vector<std::string> bad = loader.bad_images();
  EXPECT_EQ(std::set<std::string>(bad.begin(), bad.end()),
            (std::set<std::string>{"sample4.png", "sample13.png", "sample14.png"}));
}

TEST(LoaderLifecycle, DestroyMidEpochJoinsCleanly) {
  auto dataset = std::make_shared<CountingDataset>(1000);
  for (int i = 0; i < 5; ++i) {
    LoaderOptions options;
    options.batch_size = 4;
    options.num_workers = 3;
    Loader loader(dataset, index_and_draw, options);
    loader.start_epoch(i);
    ASSERT_TRUE(loader.next().has_value());
  }
  LoaderOptions options;
  Loader unused(dataset, index_and_draw, options);  // never started
  EXPECT_THROW(unused.next(), std::logic_error);
}

TEST(LoaderBatchTransform, SeededPerBatchAndIndependentOfWorkers) {
  auto dataset = std::make_shared<CountingDataset>(64);
  const BatchTransform stamp = [](Batch& batch, std::mt19937_64& rng) {
    batch.soft_targets = torch::full({batch.images.size(0), 1}, static_cast<float>(uniform01(rng)));
  };
  std::vector<std::vector<Batch>> runs;
  for (int64_t workers : {0, 2}) {
    LoaderOptions options;
    options.batch_size = 8;
    options.num_workers = workers;
    Loader loader(dataset, index_and_draw, options, stamp);
    runs.push_back(run_epoch(loader, 0));
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  for (size_t k = 0; k < runs[0].size(); ++k) {
    EXPECT_TRUE(torch::equal(runs[0][k].soft_targets, runs[1][k].soft_targets));
    if (k > 0) {
      EXPECT_FALSE(torch::equal(runs[0][k].soft_targets, runs[0][k - 1].soft_targets));
    }
  }
}

TEST(LoaderThreads, WorkersRunTorchOnOneIntraOpThread) {
  // Each worker's own torch calls (a resize) must not start a whole OpenMP team beside the training thread's,
  // while the process-wide setting stays as the caller made it.
  const int previous = at::get_num_threads();
  at::set_num_threads(4);
  auto dataset = std::make_shared<CountingDataset>(8);
  std::atomic<int> worker_threads{0};
  const SampleTransform resize = [&](RawImage, std::mt19937_64&) {
    worker_threads = std::max(worker_threads.load(), at::get_num_threads());
    const RawImage big{300, 300, 3, std::vector<uint8_t>(300 * 300 * 3, 9)};
    return preprocess(big, Preprocess{}, 224, 224, 3);
  };
  LoaderOptions options;
  options.batch_size = 2;
  options.num_workers = 2;
  {
    Loader loader(dataset, resize, options);
    EXPECT_EQ(run_epoch(loader, 0).size(), 4u);
  }
  EXPECT_EQ(worker_threads.load(), AT_PARALLEL_OPENMP ? 1 : 4);
  EXPECT_EQ(at::get_num_threads(), 4);
  at::set_num_threads(previous);
}

// ---------------------------------------------------------------- augmentation

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

RawImage gradient_image(int64_t H, int64_t W, int64_t C) {
  RawImage image{H, W, C, {}};
  for (int64_t y = 0; y < H; ++y) {
    for (int64_t x = 0; x < W; ++x) {
      for (int64_t c = 0; c < C; ++c) image.pixels.push_back(static_cast<uint8_t>((y * 9 + x * 5 + c * 60) % 256));
    }
  }
  return image;
}

ModelConfig model_of(int64_t H, int64_t W, int64_t C) {
  ModelConfig model;
  model.img_h = H;
  model.img_w = W;
  model.in_chans = C;
  return model;
}

TEST(AugmentTrain, ShapeAndDeterminism) {
  DataConfig data;
  data.augment.pad_crop = 4;
  data.augment.hflip = 0.5;
  data.augment.random_erasing = 0.5;
  const SampleTransform transform = make_train_transform(data, model_of(28, 28, 1));
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
  const SampleTransform rrc = make_train_transform(crop, model_of(16, 12, 3));
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
  EXPECT_TRUE(torch::equal(make_train_transform(data, model_of(6, 5, 3))(image, rng), plain.flip(2)));

  DataConfig padded;
  padded.augment.pad_crop = 2;
  const SampleTransform transform = make_train_transform(padded, model_of(6, 5, 3));
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
  make_train_transform(data, model_of(4, 4, 1), count_calls)(gradient_image(4, 4, 3), rng);
  EXPECT_EQ(calls.load(), 0);
  data.augment.randaugment_ops = 2;
  make_train_transform(data, model_of(4, 4, 1), count_calls)(gradient_image(4, 4, 3), rng);
  EXPECT_EQ(calls.load(), 1);
}

TEST(AugmentEval, EqualsPreprocess) {
  DataConfig data;
  data.preprocess.crop_pct = 0.9;
  const SampleTransform transform = make_eval_transform(data, model_of(20, 20, 3));
  const RawImage image = gradient_image(31, 25, 3);
  std::mt19937_64 rng(0);
  EXPECT_TRUE(torch::equal(transform(image, rng), preprocess(image, data.preprocess, 20, 20, 3)));
}

// ---------------------------------------------------------------- preprocessing

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

  // Rectangular (24, 32), crop_pct 0.8: resize to (30, 40), centre crop at (3, 4).
  p.crop_pct = 0.8;
  const torch::Tensor rectangle = preprocess(image, p, 24, 32, 3);
  ASSERT_EQ(rectangle.sizes(), (torch::IntArrayRef{3, 24, 32}));
  const RawImage stretched = resize_image(image, 30, 40, p.interpolation);
  EXPECT_TRUE(torch::equal(rectangle, preprocess(crop_image(stretched, 3, 4, 24, 32), Preprocess{}, 24, 32, 3)));

  p.crop_pct = 1.5;
  EXPECT_NE(error_of([&] { preprocess(image, p, 32, 32, 3); }).find("crop_pct"), std::string::npos);
  p.crop_pct = 1.0;
  p.interpolation = "nearest";
  EXPECT_NE(error_of([&] { preprocess(image, p, 64, 48, 3); }).find("unknown interpolation \"nearest\""),
            std::string::npos);
}

TEST(PreprocessGeometry, CentreCropRoundsLikePython) {
  EXPECT_EQ(centre_crop_offset(10, 4), 3);
  EXPECT_EQ(centre_crop_offset(5, 2), 2);  // round(1.5) = 2
  EXPECT_EQ(centre_crop_offset(7, 2), 2);  // round(2.5) = 2
  EXPECT_EQ(centre_crop_offset(9, 2), 4);  // round(3.5) = 4
}

TEST(PreprocessResize, ConstantStaysConstantAndStripesAverage) {
  for (const std::string mode : {"bilinear", "bicubic"}) {
    const RawImage flat{9, 7, 1, std::vector<uint8_t>(63, 200)};
    for (const auto& [h, w] : std::vector<std::pair<int64_t, int64_t>>{{3, 3}, {20, 15}, {9, 3}}) {
      const RawImage out = resize_image(flat, h, w, mode);
      ASSERT_EQ(static_cast<int64_t>(out.pixels.size()), h * w);
      for (uint8_t v : out.pixels) EXPECT_EQ(v, 200) << mode << " " << h << "x" << w;
    }
    // Antialiased 2x shrink of 1-pixel stripes averages them (without antialiasing it would alias to 0 or 255).
    // Away from the borders (the widened bicubic filter reaches 4 input pixels out) the taps pair up symmetrically.
    RawImage stripes{4, 16, 1, {}};
    for (int64_t y = 0; y < 4; ++y) {
      for (int64_t x = 0; x < 16; ++x) stripes.pixels.push_back(x % 2 ? 255 : 0);
    }
    const RawImage half = resize_image(stripes, 4, 8, mode);
    for (int64_t x = 2; x < 6; ++x) EXPECT_NEAR(half.pixels[2 * 8 + x], 127.5, 0.51) << mode;
  }
}

}  // namespace
}  // namespace vit
