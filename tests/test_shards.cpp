// Tar shards (data.format "wds", src/data/shards.h): shard specs, the shuffle buffer, the scan's errors, and the
// loader streaming them: every sample once per epoch across ranks, equal steps, worker-count independence, exact
// mid-epoch resume, corrupt members under on_bad_image, a truncated shard; then train/evaluate/resume through the CLI.
#include <gtest/gtest.h>

#include <archive.h>
#include <archive_entry.h>
#include <sys/wait.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <torch/torch.h>

#include "data/augment.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/shards.h"
#include "image/decode.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace vit {
namespace {

namespace stdfs = std::filesystem;
using nlohmann::json;
using test::TempDir;
using test::error_of;

// A member of a shard being written: name and bytes.
using Members = std::vector<std::pair<std::string, std::string>>;

// Writes an uncompressed tar (pax) holding `members` in order.
void write_tar(const std::string& path, const Members& members) {
  archive* writer = archive_write_new();
  archive_write_set_format_pax_restricted(writer);
  ASSERT_EQ(archive_write_open_filename(writer, path.c_str()), ARCHIVE_OK) << path;
  for (const auto& [name, bytes] : members) {
    archive_entry* entry = archive_entry_new();
    archive_entry_set_pathname(entry, name.c_str());
    archive_entry_set_size(entry, static_cast<la_int64_t>(bytes.size()));
    archive_entry_set_filetype(entry, AE_IFREG);
    archive_entry_set_perm(entry, 0644);
    archive_write_header(writer, entry);
    archive_write_data(writer, bytes.data(), bytes.size());
    archive_entry_free(entry);
  }
  archive_write_close(writer);
  archive_write_free(writer);
}

// A 4x4 grey PNG whose first two pixels spell `index` (low byte, high byte): decoding tells which sample it was.
std::string index_png(int64_t index) {
  cv::Mat image(4, 4, CV_8UC1, cv::Scalar(7));
  image.at<uint8_t>(0, 0) = static_cast<uint8_t>(index % 256);
  image.at<uint8_t>(0, 1) = static_cast<uint8_t>(index / 256);
  std::vector<uint8_t> bytes;
  cv::imencode(".png", image, bytes);
  return {bytes.begin(), bytes.end()};
}

int64_t label_of(int64_t index) { return index % 3; }

// Shards prefix-000.tar ... holding `counts[s]` samples each, numbered on across shards; labels as .cls, except
// every fourth sample, which carries a .json {"label": ...} instead. Returns the brace pattern.
std::string write_shards(const std::string& dir, const std::string& prefix, const std::vector<int>& counts) {
  int64_t index = 0;
  for (size_t s = 0; s < counts.size(); ++s) {
    Members members;
    for (int i = 0; i < counts[s]; ++i, ++index) {
      char key[32];
      std::snprintf(key, sizeof key, "sample%05lld", static_cast<long long>(index));
      members.emplace_back(std::string(key) + ".png", index_png(index));
      if (index % 4 == 3) {
        members.emplace_back(std::string(key) + ".json", json{{"label", label_of(index)}, {"x", 1}}.dump());
      } else {
        members.emplace_back(std::string(key) + ".cls", std::to_string(label_of(index)));
      }
    }
    char name[64];
    std::snprintf(name, sizeof name, "%s-%03zu.tar", prefix.c_str(), s);
    write_tar(dir + "/" + name, members);
  }
  return dir + "/" + prefix + "-{000.." + (counts.size() - 1 < 10 ? "00" : "0") + std::to_string(counts.size() - 1) +
         "}.tar";
}

DataConfig shard_config(const std::string& train, const std::string& val, int64_t buffer = 8) {
  DataConfig data;
  data.format = DataFormat::wds;
  data.train_shards = train;
  data.val_shards = val;
  data.shuffle_buffer = buffer;
  data.num_workers = 2;
  return data;
}

// The sample index a decoded row carries (see index_png); the transform keeps the raw pixels.
torch::Tensor pixels_of(ImageInput input, std::mt19937_64&) {
  const RawImage image = std::move(input).decode();
  return torch::tensor({static_cast<float>(image.pixels[0] + 256 * image.pixels[1])}).reshape({1, 1, 1});
}

// Every batch of one epoch on one rank: the dataset indices and the decoded indices of the rows.
std::vector<std::vector<int64_t>> epoch_batches(const std::shared_ptr<const Dataset>& dataset, LoaderOptions options,
                                                int64_t epoch, int64_t first_batch = 0) {
  Loader loader(dataset, pixels_of, options);
  loader.start_epoch(epoch, first_batch);
  std::vector<std::vector<int64_t>> batches;
  while (auto batch = loader.next()) {
    for (int64_t i = 0; i < batch->images.size(0); ++i) {
      EXPECT_EQ(static_cast<int64_t>(batch->images[i].item<float>()), batch->indices[i]) << "row " << i;
      EXPECT_EQ(batch->labels[i].item<int64_t>(), label_of(batch->indices[i]));
    }
    batches.push_back(batch->indices);
  }
  return batches;
}

TEST(ShardSpec, BracesListsAndFiles) {
  EXPECT_EQ(expand_braces("a-{008..011}.tar"),
            (std::vector<std::string>{"a-008.tar", "a-009.tar", "a-010.tar", "a-011.tar"}));
  EXPECT_EQ(expand_braces("{x,y}-{8..10}"),
            (std::vector<std::string>{"x-8", "x-9", "x-10", "y-8", "y-9", "y-10"}));
  EXPECT_EQ(expand_braces("plain.tar"), (std::vector<std::string>{"plain.tar"}));
  EXPECT_NE(error_of([] { expand_braces("a-{1..3.tar"); }).find("'{' without a closing '}'"), std::string::npos);
  EXPECT_EQ(expand_shard_spec("a-{0..1}.tar::b.tar"), (std::vector<std::string>{"a-0.tar", "a-1.tar", "b.tar"}));
  TempDir dir;
  test::write_bytes(dir / "list/shards.txt", "# train\nx-{0..1}.tar\n\n/abs/y.tar\n");
  EXPECT_EQ(expand_shard_spec(dir / "list/shards.txt"),
            (std::vector<std::string>{dir / "list/x-0.tar", dir / "list/x-1.tar", "/abs/y.tar"}));
}

TEST(ShardSpec, ShuffleBufferEmitsEachSampleOnceWithinItsReach) {
  std::vector<int64_t> arrivals(100);
  std::iota(arrivals.begin(), arrivals.end(), 0);
  EXPECT_EQ(shuffle_buffer_order(arrivals, 1, 5), arrivals);
  const std::vector<int64_t> emitted = shuffle_buffer_order(arrivals, 10, 5);
  EXPECT_NE(emitted, arrivals);
  EXPECT_EQ(std::set<int64_t>(emitted.begin(), emitted.end()).size(), 100u);
  for (size_t p = 0; p < emitted.size(); ++p) EXPECT_LE(emitted[p], static_cast<int64_t>(p) + 9) << "position " << p;
  EXPECT_EQ(shuffle_buffer_order(arrivals, 10, 5), emitted);
  EXPECT_NE(shuffle_buffer_order(arrivals, 10, 6), emitted);
}

TEST(ShardDataset, ScansCountsLabelsAndDecodesByIndex) {
  TempDir dir;
  const std::string train = write_shards(dir.path(), "train", {10, 10, 7});
  const std::string val = write_shards(dir.path(), "val", {5});
  DataConfig data = shard_config(train, val);
  const Splits splits = open_datasets(data, 0, image_codec());
  ASSERT_EQ(splits.train->size(), 27);
  EXPECT_EQ(splits.val->size(), 5);
  EXPECT_EQ(splits.test, splits.val);
  EXPECT_EQ(splits.train->class_names(), (std::vector<std::string>{"0", "1", "2"}));
  for (int64_t i : {0, 3, 10, 26}) {
    EXPECT_EQ(splits.train->label(i), label_of(i));
    const Sample sample = splits.train->get(i);
    EXPECT_EQ(sample.image.pixels[0] + 256 * sample.image.pixels[1], i);
    EXPECT_EQ(sample.label, label_of(i));
  }
  EXPECT_EQ(splits.train->source(12), dir / "train-001.tar#sample00012.png");
}

TEST(ShardDataset, EveryRankRunsTheSameStepsAndSeesItsSamplesOnce) {
  TempDir dir;
  const std::string train = write_shards(dir.path(), "train", {12, 12, 12, 9, 4});  // 49 samples
  const Splits splits = open_datasets(shard_config(train, train), 3, image_codec());
  LoaderOptions options;
  options.batch_size = 4;
  options.seed = 3;
  options.world_size = 2;
  std::set<int64_t> seen;
  std::vector<int64_t> steps;
  for (const bool drop_last : {false, true}) {
    seen.clear();
    steps.clear();
    int64_t rows = 0;
    for (int64_t rank = 0; rank < 2; ++rank) {
      options.rank = rank;
      options.drop_last = drop_last;
      const auto batches = epoch_batches(splits.train, options, /*epoch=*/1);
      steps.push_back(static_cast<int64_t>(batches.size()));
      for (const auto& batch : batches) {
        for (const int64_t index : batch) EXPECT_TRUE(seen.insert(index).second) << "seen twice: " << index;
        rows += static_cast<int64_t>(batch.size());
      }
    }
    if (drop_last) {
      EXPECT_EQ(steps, (std::vector<int64_t>{6, 6}));  // 49 / (4 x 2) = 6 global batches
      EXPECT_EQ(rows, 48);
    } else {
      EXPECT_EQ(rows, 49);  // every sample exactly once
      EXPECT_EQ(seen.size(), 49u);
    }
  }
}

TEST(ShardDataset, OrderDependsOnSeedAndEpochOnlyAndShuffles) {
  TempDir dir;
  const std::string train = write_shards(dir.path(), "train", {10, 10, 10, 10});
  const Splits splits = open_datasets(shard_config(train, train, 6), 0, image_codec());
  LoaderOptions options;
  options.batch_size = 5;
  options.seed = 11;
  options.num_workers = 0;
  const auto serial = epoch_batches(splits.train, options, 2);
  options.num_workers = 3;
  EXPECT_EQ(epoch_batches(splits.train, options, 2), serial) << "the worker count changed the order";
  EXPECT_NE(epoch_batches(splits.train, options, 3), serial) << "epochs should differ";
  std::vector<int64_t> flat;
  for (const auto& batch : serial) flat.insert(flat.end(), batch.begin(), batch.end());
  std::vector<int64_t> sorted = flat;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NE(flat, sorted);
  // Shards are shuffled, and the buffer mixes samples of neighbouring shards: the first batch is not one shard's
  // first five samples in order.
  EXPECT_FALSE(serial[0][1] == serial[0][0] + 1 && serial[0][2] == serial[0][0] + 2 && serial[0][3] == serial[0][0] + 3);
  // Unshuffled (evaluation): the shards' own order.
  options.shuffle = false;
  options.drop_last = false;
  flat.clear();
  for (const auto& batch : epoch_batches(splits.train, options, 2)) flat.insert(flat.end(), batch.begin(), batch.end());
  EXPECT_EQ(flat, sorted);
}

TEST(ShardDataset, ResumesMidEpochWithTheSameBatches) {
  TempDir dir;
  const std::string train = write_shards(dir.path(), "train", {9, 9, 9, 9});
  const Splits splits = open_datasets(shard_config(train, train, 5), 0, image_codec());
  LoaderOptions options;
  options.batch_size = 3;
  options.seed = 4;
  options.world_size = 2;
  options.rank = 1;
  const auto full = epoch_batches(splits.train, options, 5);
  ASSERT_EQ(full.size(), 6u);
  const auto resumed = epoch_batches(splits.train, options, 5, /*first_batch=*/4);
  EXPECT_EQ(resumed, std::vector<std::vector<int64_t>>(full.begin() + 4, full.end()));
}

TEST(ShardDataset, ScanErrorsNameTheShardAndSample) {
  TempDir dir;
  write_tar(dir / "nolabel.tar", {{"a.png", index_png(0)}, {"a.cls", "1"}, {"b.png", index_png(1)}});
  EXPECT_NE(error_of([&] { open_datasets(shard_config(dir / "nolabel.tar", dir / "nolabel.tar"), 0, image_codec()); })
                .find(dir / "nolabel.tar: sample \"b\" has no label"),
            std::string::npos);
  write_tar(dir / "noimage.tar", {{"a.cls", "1"}});
  EXPECT_NE(error_of([&] { open_datasets(shard_config(dir / "noimage.tar", dir / "noimage.tar"), 0, image_codec()); })
                .find("sample \"a\" has no image member"),
            std::string::npos);
  write_tar(dir / "badjson.tar", {{"a.png", index_png(0)}, {"a.json", "{\"y\": 2}"}});
  EXPECT_NE(error_of([&] { open_datasets(shard_config(dir / "badjson.tar", dir / "badjson.tar"), 0, image_codec()); })
                .find("no field \"label\""),
            std::string::npos);
  DataConfig data = shard_config(dir / "badjson.tar", dir / "badjson.tar");
  data.label_field = "y";
  EXPECT_EQ(open_datasets(data, 0, image_codec()).train->label(0), 2);
  EXPECT_NE(error_of([&] { open_datasets(shard_config(dir / "missing.tar", dir / "missing.tar"), 0, image_codec()); })
                .find(dir / "missing.tar: shard not found"),
            std::string::npos);
  data = shard_config(dir / "badjson.tar", dir / "badjson.tar");
  data.val_fraction = 0.2;
  EXPECT_NE(error_of([&] { open_datasets(data, 0, image_codec()); }).find("data.val_fraction does not apply"),
            std::string::npos);
  // A validation label the training shards do not have.
  write_tar(dir / "t.tar", {{"a.png", index_png(0)}, {"a.cls", "0"}});
  write_tar(dir / "v.tar", {{"a.png", index_png(0)}, {"a.cls", "4"}});
  EXPECT_NE(error_of([&] { open_datasets(shard_config(dir / "t.tar", dir / "v.tar"), 0, image_codec()); })
                .find("has label 4, but the training shards have 1 classes"),
            std::string::npos);
}

TEST(ShardDataset, TruncatedShardFailsNamingShardAndOffset) {
  TempDir dir;
  const std::string train = write_shards(dir.path(), "train", {6});
  const std::string shard = dir / "train-000.tar";
  const auto size = stdfs::file_size(shard);
  stdfs::resize_file(shard, size / 2 + 100);
  const std::string message = error_of([&] { open_datasets(shard_config(train, train), 0, image_codec()); });
  EXPECT_NE(message.find(shard + ": "), std::string::npos) << message;
  EXPECT_NE(message.find("at byte offset"), std::string::npos) << message;
}

TEST(ShardDataset, ShardCutShortAfterOpeningStopsTheEpochEvenWhenSkipping) {
  TempDir dir;
  const std::string train = write_shards(dir.path(), "train", {6, 6});
  const Splits splits = open_datasets(shard_config(train, train, 1), 0, image_codec());
  stdfs::resize_file(dir / "train-001.tar", 1536);
  LoaderOptions options;
  options.batch_size = 2;
  options.skip_bad_images = true;
  options.shuffle = false;
  Loader loader(splits.train, pixels_of, options);
  loader.start_epoch(0);
  const std::string message = error_of([&] {
    while (loader.next()) {
    }
  });
  EXPECT_NE(message.find(dir / "train-001.tar"), std::string::npos) << message;
}

TEST(ShardDataset, CorruptImageMembersFollowOnBadImage) {
  TempDir dir;
  Members members;
  for (int64_t i = 0; i < 6; ++i) {
    char key[32];
    std::snprintf(key, sizeof key, "s%lld", static_cast<long long>(i));
    members.emplace_back(std::string(key) + ".png", i == 2 ? std::string("not a png") : index_png(i));
    members.emplace_back(std::string(key) + ".cls", std::to_string(label_of(i)));
  }
  write_tar(dir / "train.tar", members);
  const Splits splits = open_datasets(shard_config(dir / "train.tar", dir / "train.tar"), 0, image_codec());
  LoaderOptions options;
  options.batch_size = 3;
  options.shuffle = false;
  options.skip_bad_images = true;
  const auto batches = epoch_batches(splits.train, options, 0);
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0], (std::vector<int64_t>{0, 1}));
  Loader loader(splits.train, pixels_of, options);
  loader.start_epoch(0);
  while (loader.next()) {
  }
  EXPECT_EQ(loader.bad_images(), (std::vector<std::string>{dir / "train.tar#s2.png"}));
  options.skip_bad_images = false;
  Loader strict(splits.train, pixels_of, options);
  strict.start_epoch(0);
  EXPECT_NE(error_of([&] { strict.next(); }).find(dir / "train.tar#s2.png"), std::string::npos);
}

// ---- through the command line ----

// Shards of 32x32 RGB PNG squares whose position gives the class (as the tiny32 fixtures): learnable in a few steps.
std::string write_square_shards(const std::string& dir, const std::string& prefix, int shards, int per_shard,
                                int seed) {
  std::mt19937_64 rng(seed);
  for (int s = 0; s < shards; ++s) {
    Members members;
    for (int i = 0; i < per_shard; ++i) {
      const int label = static_cast<int>(rng() % 4);
      cv::Mat image(32, 32, CV_8UC3, cv::Scalar(20, 20, 20));
      const int y = (label / 2) * 16 + static_cast<int>(rng() % 6), x = (label % 2) * 16 + static_cast<int>(rng() % 6);
      cv::rectangle(image, cv::Rect(x, y, 10, 10), cv::Scalar(230, 230, 230), cv::FILLED);
      std::vector<uint8_t> png;
      cv::imencode(".png", image, png);
      char key[32];  // (snprintf: GCC 12 in C++20 mode warns falsely on "literal" + std::string&&)
      std::snprintf(key, sizeof key, "k%d_%d", s, i);
      members.emplace_back(std::string(key) + ".png", std::string(png.begin(), png.end()));
      members.emplace_back(std::string(key) + ".cls", std::to_string(label));
    }
    write_tar(dir + "/" + prefix + "-" + std::to_string(s) + ".tar", members);
  }
  return dir + "/" + prefix + "-{0.." + std::to_string(shards - 1) + "}.tar";
}

std::string write_shard_config(const TempDir& dir) {
  json train{{"epochs", 3},    {"batch_size", 16},       {"lr", 2e-3},         {"warmup_steps", 3},
             {"threads", 2},   {"seed", 5},              {"log_interval", 4},  {"checkpoint_interval", 3},
             {"output_root", dir / "runs"}};
  json doc{{"model", to_json(test::tiny_vit(32, 8, 3, 4, 32, 2, 2, 2.0))},
           {"data",
            {{"format", "wds"},
             {"train_shards", write_square_shards(dir.path(), "train", 5, 40, 1)},
             {"val_shards", write_square_shards(dir.path(), "val", 1, 48, 2)},
             {"shuffle_buffer", 30},
             {"num_workers", 2},
             {"augment", {{"hflip", 0.5}}}}},
           {"train", train}};
  doc["model"]["drop_path_rate"] = 0.1;
  const std::string path = dir / "config.json";
  std::ofstream(path) << doc.dump(2);
  return path;
}

TEST(ShardTraining, TrainsEvaluatesAndResumesBitIdentically) {
  TempDir dir;
  const std::string config = write_shard_config(dir);
  const auto straight = test::run_vit("train --config '" + config + "' --out '" + dir / "straight" + "'");
  ASSERT_EQ(straight.status, 0) << straight.errors;

  // The same run killed once its first resume state exists (step 3 of 36, mid-epoch), then resumed.
  const int status = test::run_vit_and_kill("train --config '" + config + "' --out '" + dir / "resumed" + "'",
                                            dir / "resumed/state.safetensors", SIGKILL);
  EXPECT_TRUE(WIFSIGNALED(status));
  const auto rest = test::run_vit("train --resume '" + dir / "resumed" + "'");
  ASSERT_EQ(rest.status, 0) << rest.errors;
  const auto a = safetensors::read(dir / "straight/last.safetensors");
  const auto b = safetensors::read(dir / "resumed/last.safetensors");
  for (const auto& info : a.tensors) EXPECT_TRUE(torch::equal(a.tensor(info), b.tensor(info.name))) << info.name;

  const auto evaluated = test::run_vit("evaluate --checkpoint '" + dir / "straight/last.safetensors" + "' --config '" +
                                       config + "' --split val");
  ASSERT_EQ(evaluated.status, 0) << evaluated.errors;
  EXPECT_NE(evaluated.output.find("(48 samples)"), std::string::npos) << evaluated.output;  // every sample scored
}

TEST(ShardTraining, DataBenchTimesTheInputPipelinePerWorkerCount) {
  TempDir dir;
  const std::string config = write_shard_config(dir);  // 200 training samples
  const auto result = test::run_vit("bench --mode data --config '" + config + "' --workers 0,2 --batch-size 16 " +
                                    "--warmup 2 --json");
  ASSERT_EQ(result.status, 0) << result.errors;
  std::istringstream lines(result.output);
  std::vector<json> rows;
  for (std::string line; std::getline(lines, line);) rows.push_back(json::parse(line));
  ASSERT_EQ(rows.size(), 2u) << result.output;
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i]["workers"], i == 0 ? 0 : 2);
    EXPECT_EQ(rows[i]["images"], (12 - 2) * 16);  // 12 full batches in the epoch, 2 of them warm-up
    EXPECT_GT(rows[i]["img_per_s"].get<double>(), 0.0);
  }
}

// The input-pipeline bench reads only the training split: shards without val_shards, and a folder of class folders
// with no val/ and no val_fraction, both bench; training on that folder is still refused, naming what is missing.
TEST(ShardTraining, DataBenchNeedsNoValidationData) {
  TempDir dir;
  auto doc = json::parse(std::ifstream(write_shard_config(dir)));
  doc["data"].erase("val_shards");
  const std::string shards_config = dir / "shards_only.json";
  std::ofstream(shards_config) << doc.dump(2);
  const auto shards = test::run_vit("bench --mode data --config '" + shards_config +
                                    "' --workers 1 --batch-size 16 --warmup 2 --json");
  ASSERT_EQ(shards.status, 0) << shards.errors;
  EXPECT_EQ(json::parse(shards.output)["images"], (12 - 2) * 16);

  for (int label = 0; label < 4; ++label) {
    const std::string folder = dir / ("images/class" + std::to_string(label));
    std::filesystem::create_directories(folder);
    for (int i = 0; i < 10; ++i) {
      cv::Mat image(32, 32, CV_8UC3, cv::Scalar(40 * label, 20, 20 * i));
      cv::imwrite(folder + "/" + std::to_string(i) + ".png", image);
    }
  }
  doc["data"] = {{"format", "folder"}, {"root", dir / "images"}, {"num_workers", 1}};
  const std::string folder_config = dir / "folder_only.json";
  std::ofstream(folder_config) << doc.dump(2);
  const auto folder = test::run_vit("bench --mode data --config '" + folder_config +
                                    "' --workers 1 --batch-size 8 --warmup 1 --json");
  ASSERT_EQ(folder.status, 0) << folder.errors;
  EXPECT_EQ(json::parse(folder.output)["images"], (40 / 8 - 1) * 8);
  const auto train = test::run_vit("train --config '" + folder_config + "' --out '" + dir / "run" + "'");
  EXPECT_NE(train.status, 0);
  EXPECT_NE(train.errors.find("no training folder"), std::string::npos) << train.errors;
}

}  // namespace
}  // namespace vit
