// Image folders: root/<class>/<image>, a class per subfolder, files decoded on demand through the codec.
#include "data/dataset_formats.h"

#include <algorithm>
#include <set>

namespace vit::dataset_detail {
namespace {

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

}  // namespace

Splits open_folder_splits(const DataConfig& config, const std::shared_ptr<const ImageCodec>& codec,
                          bool train_only) {
  Splits splits;
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
      throw std::runtime_error(
          VIT_DATA_KEY(format) + " \"folder\": no training folder (" +
          (root.empty() ? std::string(VIT_DATA_KEY(root) + " is empty") : candidate + " not found") + "); set " +
          VIT_DATA_KEY(train_dir) + ", or " + VIT_DATA_KEY(root) + " with " + VIT_DATA_KEY(val_fraction));
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
    throw std::runtime_error(
        VIT_DATA_KEY(format) + " \"folder\": no validation folder (" +
        (root.empty() ? std::string(VIT_DATA_KEY(root) + " is empty") : under_root("val") + " not found") + "); set " +
        VIT_DATA_KEY(val_dir) + ", or " + VIT_DATA_KEY(val_fraction) + " to hold out part of the training set");
  }
  return splits;
}

}  // namespace vit::dataset_detail
