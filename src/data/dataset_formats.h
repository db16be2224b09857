// The dataset formats' shared pieces (src/data/dataset*.cpp only; nothing else includes this): the in-memory
// dataset of the packed formats (IDX, CIFAR), the file-list dataset of the image formats (folders, CSV), and each
// format's opener, which dataset.cpp's open_datasets dispatches to.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "util/fs.h"

namespace vit::dataset_detail {
namespace stdfs = std::filesystem;

// Whole dataset in one HWC byte array: IDX and CIFAR are small, and decoding them per sample would be pointless.
class InMemoryDataset final : public Dataset {
 public:
  int64_t height = 0, width = 0, channels = 0;
  std::vector<uint8_t> pixels;              // (N, H, W, C)
  std::vector<int64_t> labels;              // (N)
  std::vector<std::string> files;           // the files the samples came from
  std::vector<int32_t> file_of;             // (N) index into files
  std::vector<int32_t> index_in_file;       // (N) record number inside that file
  std::vector<std::string> names;

  int64_t size() const override { return static_cast<int64_t>(labels.size()); }
  Sample get(int64_t index) const override {
    check_index(index);
    const int64_t bytes = height * width * channels;
    Sample sample;
    sample.image = RawImage{height, width, channels, {}};
    sample.image.pixels.assign(pixels.begin() + index * bytes, pixels.begin() + (index + 1) * bytes);
    sample.label = labels[index];
    return sample;
  }
  std::string source(int64_t index) const override {
    check_index(index);
    return files[file_of[index]] + "#" + std::to_string(index_in_file[index]);
  }
  int64_t label(int64_t index) const override {
    check_index(index);
    return labels[index];
  }
  const std::vector<std::string>& class_names() const override { return names; }

 private:
  void check_index(int64_t index) const {
    if (index < 0 || index >= size()) {
      throw std::out_of_range("sample index " + std::to_string(index) + " out of range for a dataset of " +
                              std::to_string(size()) + " from " + (files.empty() ? std::string("?") : files[0]));
    }
  }
};

// Runs `work`; its errors name the file (codecs name it already; anything else gets it prefixed).
template <typename Work>
auto with_path(const std::string& path, Work work) {
  try {
    return work();
  } catch (const std::exception& error) {
    const std::string message = error.what();
    if (message.rfind(path, 0) == 0) throw;
    throw std::runtime_error(path + ": " + message);
  }
}

// Image files on disk with their labels, decoded on demand.
class FileListDataset final : public Dataset {
 public:
  FileListDataset(std::vector<std::string> paths, std::vector<int64_t> labels, std::vector<std::string> names,
                  std::shared_ptr<const ImageCodec> codec)
      : paths_(std::move(paths)), labels_(std::move(labels)), names_(std::move(names)), codec_(std::move(codec)) {}

  int64_t size() const override { return static_cast<int64_t>(paths_.size()); }
  Sample get(int64_t index) const override {
    InputSample input = get_input(index);
    return {with_path(paths_[index], [&] { return std::move(input.input).decode(); }), input.label};
  }
  InputSample get_input(int64_t index) const override {
    check_index(index);
    const std::string& path = paths_[index];
    return {ImageInput(with_path(path, [&] { return read_file(path); }), path, codec_), labels_[index]};
  }
  std::string source(int64_t index) const override {
    check_index(index);
    return paths_[index];
  }
  int64_t label(int64_t index) const override {
    check_index(index);
    return labels_[index];
  }
  const std::vector<std::string>& class_names() const override { return names_; }

 private:
  void check_index(int64_t index) const {
    if (index < 0 || index >= size()) {
      throw std::out_of_range("sample index " + std::to_string(index) + " out of range for a dataset of " +
                              std::to_string(size()) + " files");
    }
  }
  std::vector<std::string> paths_;
  std::vector<int64_t> labels_;
  std::vector<std::string> names_;
  std::shared_ptr<const ImageCodec> codec_;
};

// Throws naming the format when the build has no image codec (no OpenCV) for a format of image files.
void require_codec(const DataConfig& config, const std::shared_ptr<const ImageCodec>& codec);

// Each format's base splits (before val_fraction and subsets); val or test may be null where the format has none,
// and with `train_only` (SplitsWanted::train_only) a missing validation part is no error.
Splits open_idx_splits(const DataConfig& config);    // mnist, fashion_mnist: the IDX files
Splits open_cifar_splits(const DataConfig& config);  // cifar10, cifar100: the binary batches
Splits open_folder_splits(const DataConfig& config, const std::shared_ptr<const ImageCodec>& codec, bool train_only);
Splits open_csv_splits(const DataConfig& config, const std::shared_ptr<const ImageCodec>& codec, bool train_only);

}  // namespace vit::dataset_detail
