// IDX files (MNIST, Fashion-MNIST), raw or gzip-compressed, read once into memory with every header checked.
#include "data/dataset_formats.h"

#include <zlib.h>

#include <cstdio>

namespace vit::dataset_detail {
namespace {

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

std::string default_root(const DataConfig& config, const std::string& fallback) {
  return config.root.empty() ? fallback : config.root;
}

}  // namespace

Splits open_idx_splits(const DataConfig& config) {
  Splits splits;
  const bool fashion = config.format == DataFormat::fashion_mnist;
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
  return splits;
}

}  // namespace vit::dataset_detail
