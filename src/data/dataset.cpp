// Dataset formats, splits and subsets. Packed formats (IDX, CIFAR) are read once into memory; folder and CSV
// datasets hold paths and decode on demand through the injected codec.
#include "data/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <stdexcept>
#include <utility>

#include "data/shards.h"
#include "util/fs.h"
#include "vit/build_config.h"

namespace vit {
namespace stdfs = std::filesystem;

// ---- deterministic randomness ----

namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Salts keep the streams drawn from one user seed apart.
constexpr uint64_t kValSplitSalt = 0x76616c5f73706c74ull;     // "val_splt"
constexpr uint64_t kTrainSubsetSalt = 0x7472616e5f737562ull;  // "tran_sub"
constexpr uint64_t kValSubsetSalt = 0x76616c5f5f737562ull;    // "val__sub"
constexpr uint64_t kPerClassSalt = 0x7065725f636c7373ull;     // "per_clss"

}  // namespace

uint64_t mix_seed(std::initializer_list<uint64_t> values) {
  uint64_t hash = 0x6a09e667f3bcc909ull;
  for (uint64_t value : values) {
    uint64_t state = hash ^ value;
    hash = splitmix64(state);
  }
  return hash;
}

double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

int64_t uniform_int(std::mt19937_64& rng, int64_t n) {
  if (n <= 0) throw std::invalid_argument("uniform_int: empty range (n = " + std::to_string(n) + ")");
  return static_cast<int64_t>((static_cast<unsigned __int128>(rng()) * static_cast<uint64_t>(n)) >> 64);
}

std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[uniform_int(rng, i + 1)]);
  return order;
}

namespace {

// ---- dataset implementations ----

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
      throw std::out_of_range("sample index " + std::to_string(index) + " out of range for " +
                              std::to_string(size()) + " samples of data.classes");
    }
    return indices_[index];
  }
  std::shared_ptr<const Dataset> parent_;
  std::vector<int64_t> new_label_;  // parent label -> chosen position, -1 = not chosen
  std::vector<std::string> names_;
  std::vector<int64_t> indices_;
};

// ---- file helpers ----

// Reads a raw or gzip-compressed file (gzread passes uncompressed files through unchanged), but no more than
// `max_bytes` + 1 bytes of it: a few kilobytes of .gz can expand to gigabytes, so the caller says how much the file
// may hold, and a longer result means it holds more.
std::string read_maybe_gzipped(const std::string& path, uint64_t max_bytes) {
  require_regular_file(path);  // gzopen would wait on a FIFO
  gzFile file = gzopen(path.c_str(), "rb");
  if (!file) throw std::runtime_error(path + ": cannot open for reading");
  std::string bytes;
  char buffer[1 << 16];
  while (bytes.size() <= max_bytes) {
    const uint64_t wanted = std::min<uint64_t>(sizeof buffer, max_bytes + 1 - bytes.size());
    const int count = gzread(file, buffer, static_cast<unsigned>(wanted));
    if (count < 0) {
      int code = 0;
      const std::string reason = gzerror(file, &code);
      gzclose(file);
      throw std::runtime_error(path + ": cannot read: " + reason);
    }
    bytes.append(buffer, count);
    if (count == 0) break;
  }
  int code = 0;
  const std::string reason = gzerror(file, &code);
  gzclose(file);
  // A truncated .gz ends early with Z_BUF_ERROR rather than a read error.
  if (code != Z_OK && code != Z_STREAM_END) throw std::runtime_error(path + ": cannot read: " + reason);
  return bytes;
}

uint32_t read_big_endian32(const std::string& bytes, size_t offset) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + offset;
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string hex32(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", value);
  return text;
}

// "N bytes" for a file read whole, "more than N bytes" for one read_maybe_gzipped stopped after `expected` + 1.
std::string byte_count_text(size_t size, int64_t expected) {
  if (static_cast<int64_t>(size) > expected) return "more than " + std::to_string(expected) + " bytes";
  return std::to_string(size) + " bytes";
}

// root/name, else root/name.gz.
std::string find_raw_or_gz(const std::string& root, const std::string& name) {
  const std::string raw = (stdfs::path(root) / name).string();
  if (stdfs::exists(raw)) return raw;
  const std::string gz = raw + ".gz";
  if (stdfs::exists(gz)) return gz;
  throw std::runtime_error(root + ": neither " + name + " nor " + name + ".gz found");
}

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

// ---- IDX (MNIST, Fashion-MNIST) ----

const std::vector<std::string>& fashion_mnist_names() {
  static const std::vector<std::string> names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                 "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

std::shared_ptr<const Dataset> load_idx(const std::string& root, const std::string& prefix,
                                        const std::vector<std::string>& names) {
  const std::string images_path = find_raw_or_gz(root, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_raw_or_gz(root, prefix + "-labels-idx1-ubyte");
  // The headers are read first: they say how large each file must be, and no more than that is read.
  std::string images = read_maybe_gzipped(images_path, 16);
  std::string labels = read_maybe_gzipped(labels_path, 8);

  if (images.size() < 16) {
    throw std::runtime_error(images_path + ": truncated IDX header (" + std::to_string(images.size()) + " bytes)");
  }
  if (read_big_endian32(images, 0) != 0x00000803u) {
    throw std::runtime_error(images_path + ": bad IDX magic " + hex32(read_big_endian32(images, 0)) +
                             " (expected 0x00000803 for an image file)");
  }
  const int64_t count = read_big_endian32(images, 4);
  const int64_t rows = read_big_endian32(images, 8);
  const int64_t cols = read_big_endian32(images, 12);
  if (rows == 0 || cols == 0) {
    throw std::runtime_error(images_path + ": images of " + std::to_string(rows) + "x" + std::to_string(cols) +
                             " pixels (corrupt IDX header)");
  }
  // Three 32-bit factors: their products can pass 2^63, and must not wrap round onto the file's size.
  int64_t pixels = 0, expected_images = 0;
  if (__builtin_mul_overflow(rows, cols, &pixels) || __builtin_mul_overflow(count, pixels, &expected_images) ||
      __builtin_add_overflow(expected_images, 16, &expected_images)) {
    throw std::runtime_error(images_path + ": header declares " + std::to_string(count) + " images of " +
                             std::to_string(rows) + "x" + std::to_string(cols) + ", more than any file holds " +
                             "(corrupt IDX header)");
  }
  images = read_maybe_gzipped(images_path, static_cast<uint64_t>(expected_images));
  if (static_cast<int64_t>(images.size()) != expected_images) {
    throw std::runtime_error(images_path + ": " + byte_count_text(images.size(), expected_images) + ", expected " +
                             std::to_string(expected_images) + " for " + std::to_string(count) + " images of " +
                             std::to_string(rows) + "x" + std::to_string(cols) + " (truncated or corrupt)");
  }
  if (labels.size() < 8) {
    throw std::runtime_error(labels_path + ": truncated IDX header (" + std::to_string(labels.size()) + " bytes)");
  }
  if (read_big_endian32(labels, 0) != 0x00000801u) {
    throw std::runtime_error(labels_path + ": bad IDX magic " + hex32(read_big_endian32(labels, 0)) +
                             " (expected 0x00000801 for a label file)");
  }
  const int64_t label_count = read_big_endian32(labels, 4);
  if (label_count != count) {
    throw std::runtime_error(labels_path + ": " + std::to_string(label_count) + " labels, but " + images_path +
                             " has " + std::to_string(count) + " images");
  }
  labels = read_maybe_gzipped(labels_path, static_cast<uint64_t>(8 + count));
  if (static_cast<int64_t>(labels.size()) != 8 + count) {
    throw std::runtime_error(labels_path + ": " + byte_count_text(labels.size(), 8 + count) + ", expected " +
                             std::to_string(8 + count) + " for " + std::to_string(count) +
                             " labels (truncated or corrupt)");
  }

  auto dataset = std::make_shared<InMemoryDataset>();
  dataset->height = rows;
  dataset->width = cols;
  dataset->channels = 1;
  dataset->pixels.assign(images.begin() + 16, images.end());
  dataset->labels.resize(count);
  dataset->files = {images_path};
  dataset->file_of.assign(count, 0);
  dataset->index_in_file.resize(count);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t label = static_cast<unsigned char>(labels[8 + i]);
    if (label >= static_cast<int64_t>(names.size())) {
      throw std::runtime_error(labels_path + ": label " + std::to_string(label) + " of sample " + std::to_string(i) +
                               " is not below " + std::to_string(names.size()));
    }
    dataset->labels[i] = label;
    dataset->index_in_file[i] = static_cast<int32_t>(i);
  }
  dataset->names = names;
  return dataset;
}

// ---- CIFAR binaries ----

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

// ---- image folders ----

struct FileList {
  std::vector<std::string> paths;
  std::vector<int64_t> labels;
  std::vector<std::string> classes;
};

bool hidden(const stdfs::path& path) {
  const std::string name = path.filename().string();
  return !name.empty() && name[0] == '.';
}

std::string join_names(const std::vector<std::string>& names) {
  std::string text = "[";
  for (size_t i = 0; i < names.size(); ++i) text += (i ? ", " : "") + names[i];
  return text + "]";
}

// dir/<class>/**/<image>; classes are the sorted subfolder names.
FileList scan_folder(const std::string& dir) {
  if (!stdfs::is_directory(dir)) throw std::runtime_error(dir + ": image folder not found");
  FileList list;
  for (const auto& entry : stdfs::directory_iterator(dir)) {
    if (entry.is_directory() && !hidden(entry.path())) list.classes.push_back(entry.path().filename().string());
  }
  std::sort(list.classes.begin(), list.classes.end());
  if (list.classes.empty()) throw std::runtime_error(dir + ": no class subfolders (expected <dir>/<class>/<images>)");
  for (size_t c = 0; c < list.classes.size(); ++c) {
    const std::string class_dir = (stdfs::path(dir) / list.classes[c]).string();
    std::vector<std::string> files;
    for (auto it = stdfs::recursive_directory_iterator(class_dir); it != stdfs::recursive_directory_iterator(); ++it) {
      if (hidden(it->path())) {
        if (it->is_directory()) it.disable_recursion_pending();
        continue;
      }
      if (it->is_regular_file() && is_image_path(it->path().string())) files.push_back(it->path().string());
    }
    if (files.empty()) {
      throw std::runtime_error(class_dir + ": class folder has no images (.jpg .jpeg .png .bmp .tif .tiff .webp "
                               ".pgm .ppm .pnm)");
    }
    std::sort(files.begin(), files.end());
    for (std::string& file : files) {
      list.paths.push_back(std::move(file));
      list.labels.push_back(static_cast<int64_t>(c));
    }
  }
  return list;
}

std::shared_ptr<const Dataset> folder_split(const std::string& dir, const FileList* train, const std::string& train_dir,
                                            const std::shared_ptr<const ImageCodec>& codec) {
  FileList list = scan_folder(dir);
  if (train && list.classes != train->classes) {
    throw std::runtime_error(dir + ": class folders " + join_names(list.classes) +
                             " differ from the training classes " + join_names(train->classes) + " in " + train_dir);
  }
  return std::make_shared<FileListDataset>(std::move(list.paths), std::move(list.labels), std::move(list.classes),
                                           codec);
}

// ---- CSV lists ----

struct CsvRow {
  std::string path, label;
  int64_t line = 0;
};

std::string trim(const std::string& text) {
  size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  std::string field = text.substr(begin, end - begin);
  if (field.size() >= 2 && field.front() == '"' && field.back() == '"') field = field.substr(1, field.size() - 2);
  return field;
}

// `path,label` lines; an optional `path,label` header; paths relative to the CSV's directory. The label is after
// the last comma, so paths may contain commas.
std::vector<CsvRow> read_csv(const std::string& csv_path) {
  const std::string text = read_file(csv_path);
  const stdfs::path base = stdfs::path(csv_path).parent_path();
  std::vector<CsvRow> rows;
  size_t start = 0;
  int64_t line_number = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    ++line_number;
    if (trim(line).empty()) continue;
    const size_t comma = line.rfind(',');
    if (comma == std::string::npos) {
      throw std::runtime_error(csv_path + ":" + std::to_string(line_number) + ": expected \"path,label\", got \"" +
                               trim(line) + "\"");
    }
    CsvRow row{trim(line.substr(0, comma)), trim(line.substr(comma + 1)), line_number};
    if (rows.empty() && line_number == 1 && row.path == "path" && row.label == "label") continue;
    if (row.path.empty() || row.label.empty()) {
      throw std::runtime_error(csv_path + ":" + std::to_string(line_number) + ": empty path or label in \"" +
                               trim(line) + "\"");
    }
    const stdfs::path path(row.path);
    if (path.is_relative()) row.path = (base / path).lexically_normal().string();
    rows.push_back(std::move(row));
  }
  if (rows.empty()) throw std::runtime_error(csv_path + ": no samples");
  return rows;
}

bool is_integer_label(const std::string& label) {
  return !label.empty() && label.size() <= 9 &&
         std::all_of(label.begin(), label.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Classes of the training CSV: "0".."max" when every label is an integer, else the sorted unique names.
std::vector<std::string> csv_classes(const std::string& csv_path, const std::vector<CsvRow>& rows) {
  const bool integers =
      std::all_of(rows.begin(), rows.end(), [](const CsvRow& row) { return is_integer_label(row.label); });
  if (integers) {
    const CsvRow* max_row = &rows.front();
    for (const CsvRow& row : rows) {
      if (std::stoll(row.label) > std::stoll(max_row->label)) max_row = &row;
    }
    // Integer labels number the classes from 0: one stray huge label must not make a billion class names.
    const int64_t max_label = std::stoll(max_row->label);
    if (max_label >= kMaxClasses) {
      throw std::runtime_error(csv_path + ":" + std::to_string(max_row->line) + ": label " + max_row->label +
                               " makes " + std::to_string(max_label + 1) + " numbered classes, more than " +
                               std::to_string(kMaxClasses));
    }
    return numbered_classes(max_label + 1);
  }
  std::set<std::string> unique;
  for (const CsvRow& row : rows) unique.insert(row.label);
  return {unique.begin(), unique.end()};
}

std::shared_ptr<const Dataset> csv_split(const std::string& csv_path, const std::vector<CsvRow>& rows,
                                         const std::vector<std::string>& classes, const std::shared_ptr<const ImageCodec>& codec) {
  std::map<std::string, int64_t> index_of;
  for (size_t c = 0; c < classes.size(); ++c) index_of[classes[c]] = static_cast<int64_t>(c);
  std::vector<std::string> paths;
  std::vector<int64_t> labels;
  for (const CsvRow& row : rows) {
    // Integer classes also accept "007" for class 7.
    std::string key = row.label;
    if (is_integer_label(key) && index_of.count(key) == 0) key = std::to_string(std::stoll(key));
    const auto it = index_of.find(key);
    if (it == index_of.end()) {
      throw std::runtime_error(csv_path + ":" + std::to_string(row.line) + ": unknown label \"" + row.label +
                               "\" (not among the " + std::to_string(classes.size()) +
                               " classes of the training CSV)");
    }
    paths.push_back(row.path);
    labels.push_back(it->second);
  }
  return std::make_shared<FileListDataset>(std::move(paths), std::move(labels), classes, codec);
}

// ---- assembling the splits ----

void require_codec(const DataConfig& config, const std::shared_ptr<const ImageCodec>& codec) {
  if (!codec) {
    throw std::runtime_error(std::string("data.format \"") + name_of(config.format) +
                             "\" decodes image files, but this vit was built without OpenCV");
  }
}

std::string default_root(const DataConfig& config, const std::string& fallback) {
  return config.root.empty() ? fallback : config.root;
}

// The base splits before val_fraction / subsets; val or test may be null where the format has none.
Splits open_base(const DataConfig& config, const std::shared_ptr<const ImageCodec>& codec, SplitsWanted wanted) {
  Splits splits;
  const bool train_only = wanted == SplitsWanted::train_only;
  const DataFormat format = config.format;
  if (format == DataFormat::mnist || format == DataFormat::fashion_mnist) {
    const bool fashion = format == DataFormat::fashion_mnist;
    const std::string root = default_root(config, fashion ? "/usr/share/datasets/fashion-mnist"
                                                          : "/usr/share/datasets/mnist");
    const std::vector<std::string> names = fashion ? fashion_mnist_names() : numbered_classes(10);
    if (config.root.empty() && !stdfs::is_directory(root)) {
      throw std::runtime_error(root + ": not found; install Debian's " +
                               (fashion ? std::string("dataset-fashion-mnist package") : std::string("MNIST files")) +
                               " there, or set data.root to a folder with the IDX files (raw or .gz)");
    }
    splits.train = load_idx(root, "train", names);
    splits.test = load_idx(root, "t10k", names);
    splits.val = splits.test;
  } else if (format == DataFormat::cifar10) {
    if (config.root.empty()) throw std::runtime_error("data.format \"cifar10\" needs data.root");
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
  } else if (format == DataFormat::cifar100) {
    if (config.root.empty()) throw std::runtime_error("data.format \"cifar100\" needs data.root");
    const std::string dir = cifar_directory(config.root, "train.bin", "cifar-100-binary");
    const std::vector<std::string> names =
        names_from_file_or((stdfs::path(dir) / "fine_label_names.txt").string(), 100, numbered_classes(100));
    splits.train = load_cifar({(stdfs::path(dir) / "train.bin").string()}, 2, 100, names);
    splits.test = load_cifar({(stdfs::path(dir) / "test.bin").string()}, 2, 100, names);
    splits.val = splits.test;
  } else if (format == DataFormat::folder) {
    require_codec(config, codec);
    const std::string root = config.root;
    const auto under_root = [&](const char* name) {
      return root.empty() ? std::string() : (stdfs::path(root) / name).string();
    };
    std::string train_dir = config.train_dir;
    if (train_dir.empty()) {
      const std::string candidate = under_root("train");
      if (!candidate.empty() && stdfs::is_directory(candidate)) {
        train_dir = candidate;
      } else if ((config.val_fraction > 0 || train_only) && !root.empty()) {
        train_dir = root;  // root/<class>/..., with the validation part held out unless only training is wanted
      } else {
        throw std::runtime_error("data.format \"folder\": no training folder (" +
                                 (root.empty() ? std::string("data.root is empty") : candidate + " not found") +
                                 "); set data.train_dir, or data.root with data.val_fraction");
      }
    }
    const FileList train = scan_folder(train_dir);
    splits.train = std::make_shared<FileListDataset>(train.paths, train.labels, train.classes, codec);

    std::string val_dir = config.val_dir;
    if (val_dir.empty()) {
      const std::string candidate = under_root("val");
      if (!candidate.empty() && stdfs::is_directory(candidate) && candidate != train_dir) val_dir = candidate;
    }
    if (!val_dir.empty()) splits.val = folder_split(val_dir, &train, train_dir, codec);
    if (!config.test_dir.empty()) {
      splits.test = folder_split(config.test_dir, &train, train_dir, codec);
    } else {
      splits.test = splits.val;
    }
    if (!splits.val && config.val_fraction <= 0 && !train_only) {
      throw std::runtime_error("data.format \"folder\": no validation folder (" +
                               (root.empty() ? std::string("data.root is empty") : under_root("val") + " not found") +
                               "); set data.val_dir, or data.val_fraction to hold out part of the training set");
    }
  } else if (format == DataFormat::wds) {
    require_codec(config, codec);
    if (config.train_shards.empty()) throw std::runtime_error("data.format \"wds\" needs data.train_shards");
    if (config.val_shards.empty() && !train_only) {
      throw std::runtime_error("data.format \"wds\" needs data.val_shards");
    }
#if VIT_WITH_LIBARCHIVE
    const ShardOptions options{config.shuffle_buffer, config.label_field};
    const auto train = open_shards(config.train_shards, options, codec, nullptr);
    splits.train = train;
    if (!config.val_shards.empty()) splits.val = open_shards(config.val_shards, options, codec, train.get());
    splits.test = config.test_shards.empty() ? splits.val : open_shards(config.test_shards, options, codec, train.get());
#else
    throw std::runtime_error("data.format \"wds\" reads tar shards, but this vit was built without libarchive");
#endif
  } else {  // DataFormat::csv
    require_codec(config, codec);
    if (config.train_csv.empty()) throw std::runtime_error("data.format \"csv\" needs data.train_csv");
    const std::vector<CsvRow> train_rows = read_csv(config.train_csv);
    const std::vector<std::string> classes = csv_classes(config.train_csv, train_rows);
    splits.train = csv_split(config.train_csv, train_rows, classes, codec);
    if (!config.val_csv.empty()) splits.val = csv_split(config.val_csv, read_csv(config.val_csv), classes, codec);
    if (!config.test_csv.empty()) {
      splits.test = csv_split(config.test_csv, read_csv(config.test_csv), classes, codec);
    } else {
      splits.test = splits.val;
    }
    if (!splits.val && config.val_fraction <= 0 && !train_only) {
      throw std::runtime_error("data.format \"csv\" needs data.val_csv, or data.val_fraction to hold out part of "
                               "the training set");
    }
  }
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
        throw std::invalid_argument("data.classes: \"" + entry + "\" is neither a class of the dataset nor an " +
                                    "index below " + std::to_string(names.size()) + " (classes: " + list + ")");
      }
    }
    if (std::find(chosen.begin(), chosen.end(), index) != chosen.end()) {
      throw std::invalid_argument("data.classes: \"" + entry + "\" chooses class " + names[index] + " twice");
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
    throw std::invalid_argument("data.val_fraction " + std::to_string(config.val_fraction) + " is outside [0, 1)");
  }
  if (config.format == DataFormat::wds) {
    // Each of these picks samples by index, which a stream of shards cannot do without reading it all.
    const char* key = !config.classes.empty()      ? "data.classes"
                      : config.val_fraction > 0    ? "data.val_fraction"
                      : config.train_per_class > 0 ? "data.train_per_class"
                      : config.train_subset > 0    ? "data.train_subset"
                      : config.val_subset > 0      ? "data.val_subset"
                                                   : nullptr;
    if (key) {
      throw std::invalid_argument(std::string(key) + " does not apply to data.format \"wds\" (shards are read as a " +
                                  "stream, not by index): write the split or subset as shards of its own");
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
      throw std::runtime_error("data.val_fraction " + std::to_string(config.val_fraction) + " needs at least 2 " +
                               "training samples, got " + std::to_string(total));
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
