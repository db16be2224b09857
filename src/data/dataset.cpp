// Datasets: each format's opener (dataset_idx.cpp, dataset_cifar.cpp, dataset_folder.cpp, dataset_csv.cpp; tar
// shards in shards.cpp) behind one dispatch, then the seed-determined validation split and subsets.
#include "data/dataset.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <utility>

#include "data/dataset_formats.h"
#include "data/shards.h"
#include "util/fs.h"
#include "vit/build_config.h"

namespace vit {
namespace stdfs = std::filesystem;

namespace dataset_detail {

void require_codec(const DataConfig& config, const std::shared_ptr<const ImageCodec>& codec) {
  if (!codec) {
    throw std::runtime_error(std::string(VIT_DATA_KEY(format) + " \"") + name_of(config.format) +
                             "\" decodes image files, but this vit was built without OpenCV");
  }
}

}  // namespace dataset_detail

namespace {

// Salts keep the streams drawn from one user seed apart.
constexpr uint64_t kValSplitSalt = 0x76616c5f73706c74ull;     // "val_splt"
constexpr uint64_t kTrainSubsetSalt = 0x7472616e5f737562ull;  // "tran_sub"
constexpr uint64_t kValSubsetSalt = 0x76616c5f5f737562ull;    // "val__sub"
constexpr uint64_t kPerClassSalt = 0x7065725f636c7373ull;     // "per_clss"

class SubsetDataset final : public Dataset {
 public:
  SubsetDataset(std::shared_ptr<const Dataset> parent, std::vector<int64_t> indices)
      : parent_(std::move(parent)), indices_(std::move(indices)) {}

  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  Sample get(int64_t index) const override { return parent_->get(map(index)); }
  InputSample get_input(int64_t index) const override { return parent_->get_input(map(index)); }
  std::string source(int64_t index) const override { return parent_->source(map(index)); }
  int64_t label(int64_t index) const override { return parent_->label(map(index)); }
  const std::vector<std::string>& class_names() const override { return parent_->class_names(); }

  const std::shared_ptr<const Dataset>& parent() const { return parent_; }
  const std::vector<int64_t>& indices() const { return indices_; }

 private:
  int64_t map(int64_t index) const {
    if (index < 0 || index >= size()) {
      throw std::out_of_range("sample index " + std::to_string(index) + " out of range for a subset of " +
                              std::to_string(size()));
    }
    return indices_[index];
  }
  std::shared_ptr<const Dataset> parent_;
  std::vector<int64_t> indices_;
};

// The samples of some classes of `parent`, relabelled 0..n-1 in the order the classes were chosen (data.classes).
class ClassSubsetDataset final : public Dataset {
 public:
  ClassSubsetDataset(std::shared_ptr<const Dataset> parent, const std::vector<int64_t>& chosen)
      : parent_(std::move(parent)), new_label_(parent_->class_names().size(), -1) {
    for (size_t k = 0; k < chosen.size(); ++k) {
      new_label_[chosen[k]] = static_cast<int64_t>(k);
      names_.push_back(parent_->class_names()[chosen[k]]);
    }
    for (int64_t i = 0; i < parent_->size(); ++i) {
      const int64_t label = parent_->label(i);
      if (label >= 0 && label < static_cast<int64_t>(new_label_.size()) && new_label_[label] >= 0) indices_.push_back(i);
    }
  }

  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  Sample get(int64_t index) const override {
    Sample sample = parent_->get(map(index));
    sample.label = new_label_[sample.label];
    return sample;
  }
  InputSample get_input(int64_t index) const override {
    InputSample sample = parent_->get_input(map(index));
    sample.label = new_label_[sample.label];
    return sample;
  }
  std::string source(int64_t index) const override { return parent_->source(map(index)); }
  int64_t label(int64_t index) const override { return new_label_[parent_->label(map(index))]; }
  const std::vector<std::string>& class_names() const override { return names_; }

 private:
  int64_t map(int64_t index) const {
    if (index < 0 || index >= size()) {
      throw std::out_of_range("sample index " + std::to_string(index) + " out of range for " + std::to_string(size()) +
                              " samples of " + VIT_DATA_KEY(classes));
    }
    return indices_[index];
  }
  std::shared_ptr<const Dataset> parent_;
  std::vector<int64_t> new_label_;  // parent label -> chosen position, -1 = not chosen
  std::vector<std::string> names_;
  std::vector<int64_t> indices_;
};

// The base splits before val_fraction / subsets; val or test may be null where the format has none.
Splits open_base(const DataConfig& config, const std::shared_ptr<const ImageCodec>& codec, SplitsWanted wanted) {
  using namespace dataset_detail;
  const bool train_only = wanted == SplitsWanted::train_only;
  switch (config.format) {
    case DataFormat::mnist:
    case DataFormat::fashion_mnist:
      return open_idx_splits(config);
    case DataFormat::cifar10:
    case DataFormat::cifar100:
      return open_cifar_splits(config);
    case DataFormat::folder:
      return open_folder_splits(config, codec, train_only);
    case DataFormat::csv:
      return open_csv_splits(config, codec, train_only);
    case DataFormat::wds:
      break;
  }
  Splits splits;
    require_codec(config, codec);
    if (config.train_shards.empty()) {
      throw std::runtime_error(VIT_DATA_KEY(format) + " \"wds\" needs " + VIT_DATA_KEY(train_shards));
    }
    if (config.val_shards.empty() && !train_only) {
      throw std::runtime_error(VIT_DATA_KEY(format) + " \"wds\" needs " + VIT_DATA_KEY(val_shards));
    }
#if VIT_WITH_LIBARCHIVE
    const ShardOptions options{config.shuffle_buffer, config.label_field};
    const auto train = open_shards(config.train_shards, options, codec, nullptr);
    splits.train = train;
    if (!config.val_shards.empty()) splits.val = open_shards(config.val_shards, options, codec, train.get());
    splits.test = config.test_shards.empty() ? splits.val : open_shards(config.test_shards, options, codec, train.get());
#else
    throw std::runtime_error(VIT_DATA_KEY(format) +
                             " \"wds\" reads tar shards, but this vit was built without libarchive");
#endif
  return splits;
}

// The first `count` of a seed-shuffled order, back in dataset order.
std::shared_ptr<const Dataset> take_subset(const std::shared_ptr<const Dataset>& dataset, int64_t count,
                                           uint64_t seed) {
  if (!dataset || count <= 0 || count >= dataset->size()) return dataset;
  std::vector<int64_t> order = seeded_permutation(dataset->size(), seed);
  order.resize(count);
  std::sort(order.begin(), order.end());
  return subset(dataset, std::move(order));
}

// data.classes resolved against the dataset's class list: a class's name, else a decimal index.
std::vector<int64_t> resolve_classes(const std::vector<std::string>& wanted, const std::vector<std::string>& names) {
  std::vector<int64_t> chosen;
  for (const auto& entry : wanted) {
    int64_t index = std::find(names.begin(), names.end(), entry) - names.begin();
    if (index == static_cast<int64_t>(names.size())) {
      const bool digits = !entry.empty() && entry.find_first_not_of("0123456789") == std::string::npos;
      index = digits && entry.size() < 10 ? std::stoll(entry) : -1;
      if (index < 0 || index >= static_cast<int64_t>(names.size())) {
        std::string list;
        for (size_t i = 0; i < names.size() && i < 20; ++i) list.append(i ? ", " : "").append(names[i]);
        if (names.size() > 20) list.append(", ...");
        throw std::invalid_argument(VIT_DATA_KEY(classes) + ": \"" + entry +
                                    "\" is neither a class of the dataset nor an index below " +
                                    std::to_string(names.size()) + " (classes: " + list + ")");
      }
    }
    if (std::find(chosen.begin(), chosen.end(), index) != chosen.end()) {
      throw std::invalid_argument(VIT_DATA_KEY(classes) + ": \"" + entry + "\" chooses class " + names[index] + " twice");
    }
    chosen.push_back(index);
  }
  return chosen;
}

// At most `count` samples of each class: the first of a seed-shuffled order, back in dataset order.
std::shared_ptr<const Dataset> take_per_class(const std::shared_ptr<const Dataset>& dataset, int64_t count,
                                              uint64_t seed) {
  if (count <= 0) return dataset;
  std::vector<int64_t> taken(dataset->class_names().size(), 0);
  std::vector<int64_t> kept;
  for (const int64_t index : seeded_permutation(dataset->size(), seed)) {
    const int64_t label = dataset->label(index);
    if (label >= 0 && label < static_cast<int64_t>(taken.size()) && taken[label] < count) {
      ++taken[label];
      kept.push_back(index);
    }
  }
  if (static_cast<int64_t>(kept.size()) == dataset->size()) return dataset;
  std::sort(kept.begin(), kept.end());
  return subset(dataset, std::move(kept));
}

}  // namespace

std::pair<int64_t, int64_t> batch_positions(int64_t N, int64_t batch_size, int64_t world_size, int64_t rank,
                                            int64_t k) {
  const int64_t B = batch_size, W = world_size, r = rank;
  const int64_t full = N / (B * W);
  if (k < full) return {k * B * W + r * B, B};
  const int64_t tail = N - full * B * W;  // only reached without drop_last
  const int64_t base = tail / W, extra = tail % W;
  return {full * B * W + r * base + std::min(r, extra), base + (r < extra ? 1 : 0)};
}

InputSample Dataset::get_input(int64_t index) const {
  Sample sample = get(index);
  return {ImageInput(std::move(sample.image)), sample.label};
}

std::shared_ptr<const Dataset> subset(std::shared_ptr<const Dataset> parent, std::vector<int64_t> indices) {
  // A subset of a subset maps straight to the base dataset, so lookups stay one indirection deep.
  if (const auto* inner = dynamic_cast<const SubsetDataset*>(parent.get())) {
    for (int64_t& index : indices) {
      if (index < 0 || index >= inner->size()) {
        throw std::out_of_range("subset index " + std::to_string(index) + " out of range for a dataset of " +
                                std::to_string(inner->size()));
      }
      index = inner->indices()[index];
    }
    return std::make_shared<SubsetDataset>(inner->parent(), std::move(indices));
  }
  for (int64_t index : indices) {
    if (index < 0 || index >= parent->size()) {
      throw std::out_of_range("subset index " + std::to_string(index) + " out of range for a dataset of " +
                              std::to_string(parent->size()));
    }
  }
  return std::make_shared<SubsetDataset>(std::move(parent), std::move(indices));
}

Splits open_datasets(const DataConfig& config, uint64_t seed, const std::shared_ptr<const ImageCodec>& codec,
                     SplitsWanted wanted) {
  if (!(config.val_fraction >= 0.0 && config.val_fraction < 1.0)) {
    throw std::invalid_argument(VIT_DATA_KEY(val_fraction) + " " + std::to_string(config.val_fraction) +
                                " is outside [0, 1)");
  }
  if (config.format == DataFormat::wds) {
    // Each of these picks samples by index, which a stream of shards cannot do without reading it all.
    const std::string key = !config.classes.empty()      ? VIT_DATA_KEY(classes)
                            : config.val_fraction > 0    ? VIT_DATA_KEY(val_fraction)
                            : config.train_per_class > 0 ? VIT_DATA_KEY(train_per_class)
                            : config.train_subset > 0    ? VIT_DATA_KEY(train_subset)
                            : config.val_subset > 0      ? VIT_DATA_KEY(val_subset)
                                                         : std::string();
    if (!key.empty()) {
      throw std::invalid_argument(key + " does not apply to " + VIT_DATA_KEY(format) +
                                  " \"wds\" (shards are read as a stream, not by index): write the split or subset as shards of its own");
    }
  }
  Splits splits = open_base(config, codec, wanted);
  if (!config.classes.empty()) {
    const std::vector<int64_t> chosen = resolve_classes(config.classes, splits.train->class_names());
    // val and test often share one dataset object: select once, so they still do.
    std::map<const Dataset*, std::shared_ptr<const Dataset>> selected;
    for (auto* split : {&splits.train, &splits.val, &splits.test}) {
      if (!*split) continue;
      auto& done = selected[split->get()];
      if (!done) done = std::make_shared<ClassSubsetDataset>(*split, chosen);
      *split = done;
    }
  }

  if (config.val_fraction > 0) {
    const int64_t total = splits.train->size();
    if (total < 2) {
      throw std::runtime_error(VIT_DATA_KEY(val_fraction) + " " + std::to_string(config.val_fraction) +
                               " needs at least 2 training samples, got " + std::to_string(total));
    }
    const int64_t held_out = std::clamp<int64_t>(std::llround(static_cast<double>(total) * config.val_fraction), 1,
                                                 total - 1);
    const std::vector<int64_t> order = seeded_permutation(total, mix_seed({seed, kValSplitSalt}));
    std::vector<int64_t> val_indices(order.begin(), order.begin() + held_out);
    std::vector<int64_t> train_indices(order.begin() + held_out, order.end());
    std::sort(val_indices.begin(), val_indices.end());
    std::sort(train_indices.begin(), train_indices.end());
    const std::shared_ptr<const Dataset> full = splits.train;
    splits.train = subset(full, std::move(train_indices));
    const std::shared_ptr<const Dataset> held = subset(full, std::move(val_indices));
    // The format's own test split stays the test set; the held-out part only stands in where there is none.
    if (!splits.test) splits.test = splits.val ? splits.val : held;
    splits.val = held;
  }
  splits.train = take_per_class(splits.train, config.train_per_class, mix_seed({seed, kPerClassSalt}));
  splits.train = take_subset(splits.train, config.train_subset, mix_seed({seed, kTrainSubsetSalt}));
  splits.val = take_subset(splits.val, config.val_subset, mix_seed({seed, kValSubsetSalt}));
  return splits;
}

}  // namespace vit
