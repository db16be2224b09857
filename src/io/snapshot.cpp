// timm and Hugging Face snapshot folders: what both share (finding the weights, refusing pickles, the JSON helpers)
// and the dispatch to each format's reader and writer (snapshot_timm.cpp, snapshot_hf.cpp).
#include "io/snapshot.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "io/snapshot_json.h"
#include "util/fs.h"

namespace vit {
namespace snapshot_detail {

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw std::runtime_error(file + ": " + what);
}

[[noreturn]] void refuse(SnapshotKind kind, const std::string& what) {
  throw std::invalid_argument(std::string(name_of(kind)) + " format cannot represent " + what);
}

json read_json(const std::string& path) {
  const json doc = json::parse(read_file(path), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) fail(path, "not a JSON object");
  return doc;
}

std::string show(const json& value) { return value.dump(); }

std::string num(double value) { return json(value).dump(); }

Interpolation interpolation_from(const json& value, const std::string& file, const std::string& key) {
  if (value.is_number_integer()) {
    const int code = value.get<int>();
    if (code == 2) return Interpolation::bilinear;
    if (code == 3) return Interpolation::bicubic;
    const char* names[] = {"NEAREST", "LANCZOS", "BILINEAR", "BICUBIC", "BOX", "HAMMING"};
    fail(file, key + ": " + std::to_string(code) + " (PIL " + (code >= 0 && code <= 5 ? names[code] : "unknown") +
                   ") is not supported; vit resizes with BILINEAR (2) or BICUBIC (3)");
  }
  if (value.is_string()) {
    const auto name = value.get<std::string>();
    if (name == "bilinear") return Interpolation::bilinear;
    if (name == "bicubic") return Interpolation::bicubic;
    fail(file, key + ": \"" + name + "\" is not supported; vit resizes with bilinear or bicubic");
  }
  fail(file, key + ": " + show(value) + " is not an interpolation");
}

int64_t class_index(const std::string& key, int64_t count) {
  if (key.empty() || key.size() > 9 || key.find_first_not_of("0123456789") != std::string::npos) return -1;
  const int64_t index = std::stoll(key);
  return index < count ? index : -1;
}

std::vector<std::string> read_fields(const json& object, const std::string& path, const std::string& file,
                                     const FieldSpelling& spelling, ModelConfig& m) {
  try {
    return read_model_fields(object, path, file, spelling, m);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());
  }
}

std::string renamed(const std::string& name, const std::string& from, const std::string& to) {
  if (from.back() == '.') return name.rfind(from, 0) == 0 ? to + name.substr(from.size()) : "";
  return name == from ? to : "";
}

void fail_unknown_tensors(const std::string& path, const std::string& layout, const std::vector<std::string>& names) {
  std::string list;
  for (size_t i = 0; i < names.size() && i < 8; ++i) list += (i ? ", " : "") + names[i];
  if (names.size() > 8) list += ", ... (" + std::to_string(names.size()) + " in all)";
  fail(path, "tensors that " + layout + " does not have: " + list);
}

std::vector<double> numbers(const json& value, const std::string& file, const std::string& key) {
  if (value.is_number()) return {value.get<double>()};
  if (!value.is_array() || value.empty()) fail(file, key + ": " + show(value) + " is not a list of numbers");
  std::vector<double> out;
  for (const auto& v : value) {
    if (!v.is_number()) fail(file, key + ": " + show(value) + " is not a list of numbers");
    out.push_back(v.get<double>());
  }
  return out;
}

namespace {

// Sharded weights, as transformers' save_pretrained and timm's push_to_hub write them above their size limit: an index
// {"weight_map": {tensor: file}} beside the shards. Each file must be a plain name in the folder (never a path
// elsewhere).
std::map<std::string, std::string> read_shard_index(const std::string& index, const std::string& dir) {
  const json doc = read_json(index);
  const auto map = doc.find("weight_map");
  if (map == doc.end() || !map->is_object() || map->empty()) {
    fail(index, "no \"weight_map\" object naming the file of each tensor");
  }
  std::map<std::string, std::string> out;
  for (const auto& [name, file] : map->items()) {
    const std::string shard = file.is_string() ? file.get<std::string>() : "";
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos) {
      fail(index, "weight_map names " + show(file) + " for " + show(name) + ": not the name of a file in the folder");
    }
    out[name] = dir + "/" + shard;
  }
  return out;
}
const char* const kPickleNames[] = {"pytorch_model.bin", "model.bin", "open_clip_pytorch_model.bin", "model.pth",
                                    "checkpoint.pth", "model.pt"};

bool starts_like_pickle(const std::string& path) {
  std::error_code error;  // anything but a regular file is refused by the reader, with its kind named
  if (!std::filesystem::is_regular_file(path, error)) return false;
  std::ifstream in(path, std::ios::binary);
  unsigned char head[8] = {};
  in.read(reinterpret_cast<char*>(head), 8);
  if (in.gcount() < 8) return false;
  // A safetensors file opens with its header length, a little-endian u64 below 100 MB: bytes 4..7 are zero, and
  // bytes 0..1 may well read 0x80 0x02 (a 640-byte header). A zip's local header (version, flags) and a pickle's
  // opening opcodes do not leave them zero.
  if (head[4] == 0 && head[5] == 0 && head[6] == 0 && head[7] == 0) return false;
  // torch.save: a zip archive ("PK\3\4") or, before PyTorch 1.6, a raw pickle (protocol 2+: 0x80 then 2..5).
  return (head[0] == 'P' && head[1] == 'K' && head[2] == 3 && head[3] == 4) ||
         (head[0] == 0x80 && head[1] >= 2 && head[1] <= 5);
}

}  // namespace
}  // namespace snapshot_detail

bool is_snapshot_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void refuse_pickle(const std::string& path) {
  using namespace snapshot_detail;
  const std::string ext = lower_extension(path);
  const bool by_name = ext == ".bin" || ext == ".pth" || ext == ".pt" || ext == ".ckpt" || ext == ".pkl";
  if (!by_name && !starts_like_pickle(path)) return;
  throw std::runtime_error(
      path + ": a pickle checkpoint (torch.save), which vit never unpickles (it can run code); convert it to "
             "safetensors: python -c \"import torch, safetensors.torch as s; s.save_file(torch.load('" +
      path + "', weights_only=True), 'model.safetensors')\"");
}

Snapshot read_snapshot(const std::string& dir) {
  using namespace snapshot_detail;
  Snapshot s;
  s.dir = dir;
  while (s.dir.size() > 1 && s.dir.back() == '/') s.dir.pop_back();
  const std::string config_path = s.dir + "/config.json";
  if (!file_exists(config_path)) {
    fail(s.dir, "a folder without config.json (vit reads timm and Hugging Face snapshot folders, or a model file)");
  }
  const json config = read_json(config_path);
  s.weights = s.dir + "/model.safetensors";
  if (!file_exists(s.weights) && file_exists(s.dir + "/model.safetensors.index.json")) {
    s.weights = s.dir + "/model.safetensors.index.json";
    s.shard_of = read_shard_index(s.weights, s.dir);
  } else if (!file_exists(s.weights)) {
    for (const char* name : kPickleNames) {
      if (file_exists(s.dir + "/" + name)) refuse_pickle(s.dir + "/" + name);
    }
    fail(s.dir, "no model.safetensors (nor model.safetensors.index.json) beside config.json");
  }
  if (config.contains("architecture")) {
    s.kind = SnapshotKind::timm;
    read_timm(config, s);
  } else if (config.contains("model_type")) {
    s.kind = SnapshotKind::hf;
    read_hf(config, s);
  } else {
    fail(config_path, "neither a timm config (\"architecture\") nor a Hugging Face one (\"model_type\")");
  }
  try {
    validate(s.model, config_path);
    s.preprocess = parse_preprocess(to_json(s.preprocess), config_path);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());
  }
  if (!s.class_names.empty() && static_cast<int64_t>(s.class_names.size()) != s.model.num_classes) {
    fail(config_path, std::to_string(s.class_names.size()) + " class names for " +
                          std::to_string(s.model.num_classes) + " classes");
  }
  return s;
}

std::map<std::string, nlohmann::json> snapshot_files(SnapshotKind kind, const ModelConfig& m, const Preprocess& p,
                                                     const std::vector<std::string>& class_names) {
  using namespace snapshot_detail;
  if (m.rel_pos_bias) refuse(kind, "the relative position bias (model.rel_pos_bias)");
  return kind == SnapshotKind::timm ? timm_files(m, p, class_names) : hf_files(m, p, class_names);
}

}  // namespace vit
