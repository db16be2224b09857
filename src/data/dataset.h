// Datasets: IDX (MNIST, Fashion-MNIST) and CIFAR binaries held in memory, image folders, CSV lists and tar shards
// decoded through an injected codec (the core library has no OpenCV), plus seed-determined splits and subsets.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "data/image.h"
#include "data/seeded.h"

namespace vit {

// ---- datasets ----

struct Sample {
  RawImage image;
  int64_t label = -1;
};

// A sample as the loader hands it to a transform: datasets of image files pass the encoded file on undecoded.
struct InputSample {
  ImageInput input;
  int64_t label = -1;
};

class Dataset {  // get() must be thread-safe (called from loader worker threads)
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Sample get(int64_t index) const = 0;          // throws one line naming the file on a bad image
  virtual std::string source(int64_t index) const = 0;   // file path, or "<file>#<index>" for packed formats
  virtual int64_t label(int64_t index) const = 0;        // without decoding
  virtual const std::vector<std::string>& class_names() const = 0;
  // What the loader transforms: by default get()'s pixels; datasets of files return the encoded bytes.
  virtual InputSample get_input(int64_t index) const;
};

// The layout of one epoch in the Loader's global order (loader.h): W ranks, batches of B rows on each.
struct EpochLayout {
  uint64_t seed = 0;
  int64_t epoch = 0;
  bool shuffle = true;
  int64_t batch_size = 1;  // B
  int64_t world_size = 1;  // W
};

// The Loader's sharding rule (loader.h), in one place: order positions [first, first + count) of batch k on rank
// `rank` of an epoch of N samples with W ranks of B rows.
std::pair<int64_t, int64_t> batch_positions(int64_t N, int64_t batch_size, int64_t world_size, int64_t rank,
                                            int64_t k);

// Hands over the samples of one rank's part of an epoch, read front to back on a background thread.
class SampleStream {
 public:
  virtual ~SampleStream() = default;
  // Blocks until sample `index` (one this stream was opened for, each taken once) has been read; rethrows a read
  // error (a truncated shard) on the caller's thread.
  virtual InputSample take(int64_t index) = 0;
};

// A dataset that is read front to back (tar shards) rather than by index: the epoch's order is the stream's own
// (shards shuffled, then a shuffle buffer), and the loader reads samples through a SampleStream in that order.
// get() still works (by seeking through a shard), for tools and tests.
class StreamDataset : public Dataset {
 public:
  // The epoch's order in the Loader's global layout (batch_positions), where rank r's samples are a contiguous run of the epoch's shard sequence, N/W of them
  // (the first N mod W ranks one more), in the order the shuffle buffer emits them.
  virtual std::vector<int64_t> epoch_order(const EpochLayout& layout) const = 0;
  // Reads rank `rank`'s run of the epoch's shard sequence, keeping the samples in `wanted` (the indices the rank
  // will take, in the order it takes them) and skipping the others unread. `capacity` is how many samples the
  // loader may have in flight; the stream holds at most that many plus its own look-ahead (the shuffle buffer).
  virtual std::unique_ptr<SampleStream> open_stream(const EpochLayout& layout, int64_t rank,
                                                    const std::vector<int64_t>& wanted, int64_t capacity) const = 0;
};

// The view of `parent` through `indices` (dataset order follows `indices`).
std::shared_ptr<const Dataset> subset(std::shared_ptr<const Dataset> parent, std::vector<int64_t> indices);

struct Splits {
  std::shared_ptr<const Dataset> train, val, test;
};

// Opens the configured dataset (DataConfig::format: mnist | fashion_mnist | cifar10 | cifar100 | folder | csv | wds).
// codec may be null (core-only build): folder/csv/wds then throw "built without OpenCV". wds streams its shards, so
// it takes its splits from train_shards/val_shards/test_shards and refuses classes, val_fraction and the subsets.
// val_fraction > 0 holds out that fraction of the training set (chosen by seed) as val, and test is the format's
// test split (folder/csv: test_dir/test_csv, else val_dir/val_csv when present, else the held-out part);
// otherwise val is the format's val (folder/csv) or test split. classes (non-empty) first keeps those classes in every
// split, relabelled 0..n-1 in the listed order. After the val split, train_per_class > 0 keeps at most N training
// samples of each class, and train_subset / val_subset > 0 keep the first N of a seed-shuffled order (kept in dataset
// order afterwards). Splits never change with anything but the seed.
// SplitsWanted::train_only (the input-pipeline bench): val and test may be absent, so a folder of class folders, a
// shard list or a CSV without validation data opens; a folder root without a train/ folder is the training set.
enum class SplitsWanted { all, train_only };
Splits open_datasets(const DataConfig& config, uint64_t seed, const std::shared_ptr<const ImageCodec>& codec,
                     SplitsWanted wanted = SplitsWanted::all);

}  // namespace vit
