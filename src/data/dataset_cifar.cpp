// CIFAR-10 and CIFAR-100 binary batches, read once into memory (records to HWC bytes).
#include "data/dataset_formats.h"

#include <fstream>

namespace vit::dataset_detail {
namespace {

// Non-empty, trimmed lines of a text file (class-name lists).
std::vector<std::string> read_name_lines(const std::string& path) {
  std::vector<std::string> names;
  std::string text = read_file(path);
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    size_t first = 0;
    while (first < line.size() && std::isspace(static_cast<unsigned char>(line[first]))) ++first;
    if (first < line.size()) names.push_back(line.substr(first));
    start = end + 1;
  }
  return names;
}

// Appends one CIFAR binary (records of label bytes + 3072 planar R, G, B bytes) converted to HWC.
void append_cifar_file(InMemoryDataset& dataset, const std::string& path, int64_t label_bytes, int64_t num_classes) {
  constexpr int64_t kPlane = 32 * 32;
  const int64_t record = label_bytes + 3 * kPlane;
  const std::string bytes = read_file(path);
  const int64_t size = static_cast<int64_t>(bytes.size());
  if (size == 0 || size % record != 0) {
    throw std::runtime_error(path + ": size " + std::to_string(size) + " bytes is not a multiple of the record size " +
                             std::to_string(record) + " (truncated or not a CIFAR batch)");
  }
  const int64_t count = size / record;
  const int32_t file_id = static_cast<int32_t>(dataset.files.size());
  dataset.files.push_back(path);
  const int64_t first = dataset.size();
  dataset.pixels.resize((first + count) * 3 * kPlane);
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t* rec = data + i * record;
    // CIFAR-100 records hold (coarse, fine); we classify the fine label, the last label byte either way.
    const int64_t label = rec[label_bytes - 1];
    if (label >= num_classes) {
      throw std::runtime_error(path + ": label " + std::to_string(label) + " of record " + std::to_string(i) +
                               " is not below " + std::to_string(num_classes));
    }
    const uint8_t* planes = rec + label_bytes;
    uint8_t* out = dataset.pixels.data() + (first + i) * 3 * kPlane;  // (32, 32, 3)
    for (int64_t p = 0; p < kPlane; ++p) {
      out[3 * p] = planes[p];
      out[3 * p + 1] = planes[kPlane + p];
      out[3 * p + 2] = planes[2 * kPlane + p];
    }
    dataset.labels.push_back(label);
    dataset.file_of.push_back(file_id);
    dataset.index_in_file.push_back(static_cast<int32_t>(i));
  }
}

std::shared_ptr<const Dataset> load_cifar(const std::vector<std::string>& paths, int64_t label_bytes,
                                          int64_t num_classes, const std::vector<std::string>& names) {
  auto dataset = std::make_shared<InMemoryDataset>();
  dataset->height = dataset->width = 32;
  dataset->channels = 3;
  for (const std::string& path : paths) append_cifar_file(*dataset, path, label_bytes, num_classes);
  dataset->names = names;
  return dataset;
}

// The official archives unpack into a subfolder; accept either the root or that subfolder.
std::string cifar_directory(const std::string& root, const std::string& probe, const std::string& archive_folder) {
  if (stdfs::exists(stdfs::path(root) / probe)) return root;
  const stdfs::path nested = stdfs::path(root) / archive_folder;
  if (stdfs::exists(nested / probe)) return nested.string();
  throw std::runtime_error(root + ": no " + probe + " (nor " + archive_folder + "/" + probe + ")");
}

std::vector<std::string> names_from_file_or(const std::string& path, int64_t count,
                                            const std::vector<std::string>& fallback) {
  if (!stdfs::exists(path)) return fallback;
  std::vector<std::string> names = read_name_lines(path);
  if (static_cast<int64_t>(names.size()) != count) {
    throw std::runtime_error(path + ": " + std::to_string(names.size()) + " class names, expected " +
                             std::to_string(count));
  }
  return names;
}

}  // namespace

Splits open_cifar_splits(const DataConfig& config) {
  Splits splits;
  if (config.format == DataFormat::cifar10) {
    if (config.root.empty()) {
      throw std::runtime_error(VIT_DATA_KEY(format) + " \"cifar10\" needs " + VIT_DATA_KEY(root));
    }
    const std::string dir = cifar_directory(config.root, "data_batch_1.bin", "cifar-10-batches-bin");
    const std::vector<std::string> names = names_from_file_or(
        (stdfs::path(dir) / "batches.meta.txt").string(), 10,
        {"airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"});
    std::vector<std::string> train_files;
    for (int i = 1; i <= 5; ++i) {
      train_files.push_back((stdfs::path(dir) / ("data_batch_" + std::to_string(i) + ".bin")).string());
    }
    splits.train = load_cifar(train_files, 1, 10, names);
    splits.test = load_cifar({(stdfs::path(dir) / "test_batch.bin").string()}, 1, 10, names);
    splits.val = splits.test;
  } else {  // DataFormat::cifar100
    if (config.root.empty()) {
      throw std::runtime_error(VIT_DATA_KEY(format) + " \"cifar100\" needs " + VIT_DATA_KEY(root));
    }
    const std::string dir = cifar_directory(config.root, "train.bin", "cifar-100-binary");
    const std::vector<std::string> names =
        names_from_file_or((stdfs::path(dir) / "fine_label_names.txt").string(), 100, numbered_classes(100));
    splits.train = load_cifar({(stdfs::path(dir) / "train.bin").string()}, 2, 100, names);
    splits.test = load_cifar({(stdfs::path(dir) / "test.bin").string()}, 2, 100, names);
    splits.val = splits.test;
  }
  return splits;
}

}  // namespace vit::dataset_detail
