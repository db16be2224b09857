// Datasets: IDX (MNIST, Fashion-MNIST) and CIFAR binaries held in memory, image folders and CSV lists decoded
// through an injected decoder (the core library has no OpenCV), plus seed-determined splits and subsets.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/image.h"

namespace vit {

// ---- deterministic randomness shared by splits, the loader and augmentation ----
// Every draw is our own arithmetic on std::mt19937_64 (whose output the standard fixes), never a std::
// distribution (whose algorithms vary between standard libraries), so results are identical on every platform.

// splitmix64 chain over the values: a well-spread seed for each (seed, epoch, position, ...) tuple.
uint64_t mix_seed(std::initializer_list<uint64_t> values);
// Uniform double in [0, 1) from the top 53 bits.
double uniform01(std::mt19937_64& rng);
// Uniform integer in [0, n), n > 0 (multiply-shift; bias below n / 2^64).
int64_t uniform_int(std::mt19937_64& rng, int64_t n);
// Fisher-Yates permutation of 0..n-1 driven by mt19937_64(seed).
std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed);

// ---- datasets ----

// Turns a file path into pixels; may be empty in a build without OpenCV. Must be thread-safe.
using ImageDecoder = std::function<RawImage(const std::string& path)>;

struct Sample {
  RawImage image;
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
};

// The view of `parent` through `indices` (dataset order follows `indices`).
std::shared_ptr<const Dataset> subset(std::shared_ptr<const Dataset> parent, std::vector<int64_t> indices);

struct Splits {
  std::shared_ptr<const Dataset> train, val, test;
};

// Opens the configured dataset (DataConfig::format: mnist | fashion_mnist | cifar10 | cifar100 | folder | csv).
// decoder may be empty (core-only build): folder/csv then throw "built without OpenCV".
// val_fraction > 0 holds out that fraction of the training set (chosen by seed) as val, and test is the format's
// test split (folder/csv: test_dir/test_csv, else val_dir/val_csv when present, else the held-out part);
// otherwise val is the format's val (folder/csv) or test split. classes (non-empty) first keeps those classes in every
// split, relabelled 0..n-1 in the listed order. After the val split, train_per_class > 0 keeps at most N training
// samples of each class, and train_subset / val_subset > 0 keep the first N of a seed-shuffled order (kept in dataset
// order afterwards). Splits never change with anything but the seed.
Splits open_datasets(const DataConfig& config, uint64_t seed, const ImageDecoder& decoder);

}  // namespace vit
