// CSV lists of `path,label` lines, paths relative to the CSV, files decoded on demand through the codec.
#include "data/dataset_formats.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <set>

namespace vit::dataset_detail {
namespace {

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

}  // namespace

Splits open_csv_splits(const DataConfig& config, const std::shared_ptr<const ImageCodec>& codec,
                       bool train_only) {
  Splits splits;
  require_codec(config, codec);
  if (config.train_csv.empty()) {
    throw std::runtime_error(VIT_DATA_KEY(format) + " \"csv\" needs " + VIT_DATA_KEY(train_csv));
  }
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
    throw std::runtime_error(VIT_DATA_KEY(format) + " \"csv\" needs " + VIT_DATA_KEY(val_csv) + ", or " +
                             VIT_DATA_KEY(val_fraction) + " to hold out part of the training set");
  }
  return splits;
}

}  // namespace vit::dataset_detail
