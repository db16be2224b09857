// libFuzzer target: the packed and list dataset readers (data/dataset.h): IDX (MNIST), CIFAR-10/100 binaries and CSV
// lists, opened through open_datasets from files written to a private folder in /dev/shm, then every sample touched.
//
// Input: byte 0 chooses the reader (low 2 bits) and the split options (high bits); bytes 1-2 (little-endian) are the
// length of part A, the rest is part B. IDX: A = image file, B = label file (both splits). CIFAR: A = every batch
// file, B = the class-name list. CSV: A = train list, B = val list.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "data/dataset.h"
#include "scratch.h"

namespace {

const std::string& folder() { return vit::fuzz::scratch_dir(); }

void write(const std::string& name, const std::string& bytes) {
  std::ofstream(folder() + "/" + name, std::ios::binary | std::ios::trunc) << bytes;
}

// CSV datasets only hold paths; a sample is never decoded here (its path could name anything on this machine).
std::shared_ptr<const vit::ImageCodec> refusing_codec() {
  auto codec = std::make_shared<vit::ImageCodec>();
  codec->decode = [](const std::string&, const std::string& name) -> vit::RawImage {
    throw std::runtime_error(name + ": not decoded by the fuzzer");
  };
  return codec;
}

void touch(const std::shared_ptr<const vit::Dataset>& dataset, bool decode) {
  if (!dataset) return;
  const int64_t classes = static_cast<int64_t>(dataset->class_names().size());
  for (int64_t i = 0; i < dataset->size(); ++i) {
    const int64_t label = dataset->label(i);
    if (label < 0 || label >= classes) std::abort();  // a label outside the class list is a reader bug
    dataset->source(i);
    if (decode) vit::check_image(dataset->get(i).image, dataset->source(i));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const uint8_t mode = data[0];
  const size_t length_a = std::min<size_t>(data[1] | (size_t{data[2]} << 8), size - 3);
  const std::string a(reinterpret_cast<const char*>(data) + 3, length_a);
  const std::string b(reinterpret_cast<const char*>(data) + 3 + length_a, size - 3 - length_a);

  std::filesystem::remove_all(folder());
  std::filesystem::create_directories(folder());
  vit::DataConfig config;
  config.root = folder();
  switch (mode & 3) {
    case 0:
      config.format = vit::DataFormat::mnist;
      for (const char* split : {"train", "t10k"}) {
        write(std::string(split) + "-images-idx3-ubyte", a);
        write(std::string(split) + "-labels-idx1-ubyte", b);
      }
      break;
    case 1:
      config.format = vit::DataFormat::cifar10;
      for (const char* name : {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
                               "data_batch_5.bin", "test_batch.bin"}) {
        write(name, a);
      }
      if (!b.empty()) write("batches.meta.txt", b);
      break;
    case 2:
      config.format = vit::DataFormat::cifar100;
      write("train.bin", a);
      write("test.bin", a);
      if (!b.empty()) write("fine_label_names.txt", b);
      break;
    default:
      config.format = vit::DataFormat::csv;
      config.train_csv = folder() + "/train.csv";
      config.val_csv = folder() + "/val.csv";
      write("train.csv", a);
      write("val.csv", b);
      break;
  }
  // The split options on top of the reader, as a config may set them.
  if (mode & 0x04) config.val_fraction = 0.25;
  if (mode & 0x08) config.classes = {"1", "0"};
  if (mode & 0x10) config.train_per_class = 2;
  if (mode & 0x20) config.train_subset = 3;
  if (mode & 0x40) config.val_subset = 1;
  try {
    const vit::Splits splits = vit::open_datasets(config, /*seed=*/mode >> 7, refusing_codec());
    const bool decode = config.format != vit::DataFormat::csv;
    touch(splits.train, decode);
    touch(splits.val, decode);
    touch(splits.test, decode);
  } catch (const std::exception&) {
  }
  return 0;
}
