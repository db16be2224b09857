// Model files: save and load complete, self-describing models in safetensors (timm-compatible tensor names).
#include "io/model_file.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "io/snapshot.h"
#include "model/flops.h"
#include "util/fs.h"
#include "util/text.h"

namespace vit {
using nlohmann::json;

std::vector<std::pair<std::string, torch::Tensor>> state_tensors(VisionTransformer& net) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : net->named_parameters(/*recurse=*/true)) {
    out.emplace_back(item.key(), item.value().detach().to(torch::kCPU, torch::kFloat32).contiguous());
  }
  for (const auto& item : net->named_buffers(/*recurse=*/true)) {
    out.emplace_back(item.key(), item.value().detach().to(torch::kCPU, torch::kFloat32).contiguous());
  }
  return out;
}

void save_model(const std::string& path, VisionTransformer& net, const Preprocess& preprocess,
                const std::vector<std::string>& class_names, const std::map<std::string, std::string>& extra,
                Precision precision) {
  if (precision != Precision::fp32 && precision != Precision::int8) {
    throw std::invalid_argument(std::string("a vit model file holds fp32 or int8 weights, not ") + name_of(precision));
  }
  const bool int8 = precision == Precision::int8;
  std::map<std::string, std::string> metadata = extra;
  metadata["format"] = kModelFormat;
  metadata["format_version"] = std::to_string(int8 ? kModelFormatVersionInt8 : kModelFormatVersion);
  if (int8) metadata["precision"] = "int8";
  metadata["model"] = to_json(net->config()).dump();
  metadata["preprocess"] = to_json(preprocess).dump();
  // Class names may be folder names, which need not be UTF-8: bad bytes become U+FFFD rather than failing the save.
  metadata["class_names"] = json(class_names).dump(-1, ' ', false, json::error_handler_t::replace);
  auto tensors = state_tensors(net);
  if (int8) {
    const auto names = net->quantized_weight_names();
    std::vector<std::pair<std::string, torch::Tensor>> quantized;
    for (auto& [name, tensor] : tensors) {
      if (std::find(names.begin(), names.end(), name) == names.end()) {
        quantized.emplace_back(name, tensor);
        continue;
      }
      auto [q, scales] = quantize_weight_int8(tensor.reshape({tensor.size(0), -1}));
      quantized.emplace_back(name, q.view(tensor.sizes()));
      quantized.emplace_back(name + "_scale", scales);
    }
    tensors = std::move(quantized);
  }
  safetensors::write(path, tensors, metadata);
}

namespace {

std::map<std::string, torch::Tensor> model_targets(VisionTransformer& net) {
  std::map<std::string, torch::Tensor> targets;
  for (const auto& item : net->named_parameters(true)) targets[item.key()] = item.value();
  for (const auto& item : net->named_buffers(true)) targets[item.key()] = item.value();
  return targets;
}

// Throws listing every missing, unexpected and mis-shaped tensor of `shapes` (name -> shape) against `targets`.
void check_names_and_shapes(const std::map<std::string, torch::Tensor>& targets,
                            const std::map<std::string, std::vector<int64_t>>& shapes, const std::string& path) {
  std::vector<std::string> missing, mismatched, unexpected;
  for (const auto& [name, target] : targets) {
    auto it = shapes.find(name);
    if (it == shapes.end()) {
      missing.push_back(name);
    } else if (target.sizes() != c10::IntArrayRef(it->second)) {
      std::ostringstream s;
      s << name << " (file " << c10::IntArrayRef(it->second) << ", model " << target.sizes() << ")";
      mismatched.push_back(s.str());
    }
  }
  for (const auto& item : shapes) {
    if (!targets.count(item.first)) unexpected.push_back(item.first);
  }
  if (missing.empty() && mismatched.empty() && unexpected.empty()) return;
  auto list = [](const std::vector<std::string>& names) {
    std::string s;
    const size_t shown = std::min<size_t>(names.size(), 8);
    for (size_t i = 0; i < shown; ++i) s += (i ? ", " : "") + names[i];
    if (names.size() > shown) s += ", ... (" + std::to_string(names.size()) + " in all)";
    return s;
  };
  std::string message = path + ": tensors do not match the model";
  if (!missing.empty()) message += "; missing: " + list(missing);
  if (!unexpected.empty()) message += "; unexpected: " + list(unexpected);
  if (!mismatched.empty()) message += "; wrong shape: " + list(mismatched);
  throw std::runtime_error(message);
}

}  // namespace

void load_state(VisionTransformer& net, const std::map<std::string, torch::Tensor>& tensors, const std::string& path) {
  auto targets = model_targets(net);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, tensor] : tensors) shapes[name] = tensor.sizes().vec();
  check_names_and_shapes(targets, shapes, path);
  torch::NoGradGuard no_grad;
  for (auto& [name, target] : targets) target.copy_(tensors.at(name));
}

namespace {

std::map<std::string, torch::Tensor> all_tensors(const safetensors::Archive& archive) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& info : archive.tensors) out[info.name] = archive.tensor(info, /*as_float32=*/true);
  return out;
}

// weight = int8 x scale, one scale per output row (kModelFormatVersionInt8), as float32 in the weight's shape.
torch::Tensor dequantized(const torch::Tensor& q, const torch::Tensor& scales, const std::string& name,
                          const std::string& path) {
  if (scales.dim() != 1 || q.dim() < 2 || scales.size(0) != q.size(0)) {
    std::ostringstream message;
    message << path << ": " << name << "_scale has shape " << scales.sizes() << ", not one scale per row of " << name
            << " " << q.sizes();
    throw std::runtime_error(message.str());
  }
  std::vector<int64_t> shape(static_cast<size_t>(q.dim()), 1);
  shape[0] = q.size(0);
  return q.to(torch::kFloat32) * scales.to(torch::kFloat32).view(shape);
}

// An int8 model file's tensors with each quantized weight dequantized and its scale dropped.
void dequantize_all(std::map<std::string, torch::Tensor>& tensors, const std::string& path) {
  for (auto it = tensors.begin(); it != tensors.end();) {
    const std::string& name = it->first;
    const std::string suffix = "_scale";
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      const std::string weight = name.substr(0, name.size() - suffix.size());
      auto found = tensors.find(weight);
      if (found == tensors.end()) {
        throw std::runtime_error(path + ": " + name + " has no weight " + weight + " beside it");
      }
      found->second = dequantized(found->second, it->second, weight, path);
      it = tensors.erase(it);
    } else {
      ++it;
    }
  }
}

const std::string& metadata_value(const std::map<std::string, std::string>& metadata, const std::string& key,
                                  const std::string& path) {
  auto it = metadata.find(key);
  if (it == metadata.end()) throw std::runtime_error(path + ": metadata has no \"" + key + "\"");
  return it->second;
}

json metadata_json(const std::map<std::string, std::string>& metadata, const std::string& key,
                   const std::string& path) {
  json value = json::parse(metadata_value(metadata, key, path), nullptr, false);
  if (value.is_discarded()) throw std::runtime_error(path + ": metadata \"" + key + "\" is not valid JSON");
  return value;
}

}  // namespace

namespace {

// For each of our tensor names, the snapshot tensors it is made of (one, or HF's query, key and value stacked), from
// its one weights file or from the shards its index names.
struct SnapshotWeights {
  using Part = std::pair<const safetensors::File*, const safetensors::TensorInfo*>;
  std::string path;  // model.safetensors, or the shard index
  std::map<std::string, std::unique_ptr<safetensors::File>> files;  // by path
  std::map<std::string, std::vector<Part>> parts;
  uint64_t data_size = 0;  // of every file together

  explicit SnapshotWeights(const Snapshot& snapshot) : path(snapshot.weights) {
    std::map<std::string, const safetensors::File*> where;  // their name -> the file holding it
    if (snapshot.shard_of.empty()) {
      const auto& file = open(snapshot.weights);
      for (const auto& info : file.tensors()) where[info.name] = &file;
    } else {
      for (const auto& [name, shard] : snapshot.shard_of) {
        const auto& file = open(shard);
        if (file.find(name) == nullptr) {
          throw std::runtime_error(path + ": its weight_map puts " + name + " in " + shard + ", which does not hold it");
        }
        where[name] = &file;
      }
      for (const auto& [file_path, file] : files) {
        for (const auto& info : file->tensors()) {
          if (where.count(info.name) == 0 || where.at(info.name) != file.get()) {
            throw std::runtime_error(file_path + ": holds " + info.name + ", which the weight_map of " + path +
                                     " does not place there");
          }
        }
      }
    }
    std::vector<std::string> names;
    for (const auto& [name, file] : where) names.push_back(name);
    for (const auto& [ours, theirs] : snapshot_names(snapshot.kind, snapshot.model, names, path)) {
      for (const auto& name : theirs) parts[ours].emplace_back(where.at(name), where.at(name)->find(name));
    }
  }
  const safetensors::File& open(const std::string& file_path) {
    auto& slot = files[file_path];
    if (!slot) {
      slot = std::make_unique<safetensors::File>(file_path);
      data_size += slot->data_size();
    }
    return *slot;
  }
  // Our name -> shape (stacked parts along dim 0); a stack of mismatched parts fails naming them.
  std::map<std::string, std::vector<int64_t>> shapes() const {
    std::map<std::string, std::vector<int64_t>> out;
    for (const auto& [ours, infos] : parts) {
      std::vector<int64_t> shape = infos[0].second->shape;
      for (size_t i = 1; i < infos.size(); ++i) {
        auto rest = infos[i].second->shape;
        if (rest.empty() || shape.empty() || std::vector<int64_t>(rest.begin() + 1, rest.end()) !=
                                                 std::vector<int64_t>(shape.begin() + 1, shape.end())) {
          throw std::runtime_error(path + ": " + infos[0].second->name + " and " + infos[i].second->name +
                                   " have shapes that do not stack into " + ours);
        }
        // Parts with a zero dimension hold no data whatever their first: their sum must not wrap.
        if (__builtin_add_overflow(shape[0], rest[0], &shape[0])) {
          throw std::runtime_error(path + ": " + infos[0].second->name + " and " + infos[i].second->name +
                                   " stack into more rows than any tensor holds (" + ours + ")");
        }
      }
      out[ours] = shape;
    }
    return out;
  }
  void read_into(const std::string& ours, torch::Tensor target) const {
    int64_t row = 0;
    const auto& infos = parts.at(ours);
    for (const auto& [file, info] : infos) {
      const int64_t rows = info->shape.empty() ? 1 : info->shape[0];
      file->read_into(*info, infos.size() == 1 ? target : target.narrow(0, row, rows));
      row += rows;
    }
  }
};

}  // namespace

namespace {

// The model a self-describing file runs as: its own, or the same at --config's img_size when the config describes
// this model (every other field equal; dropout rates, which only training reads, aside).
ModelConfig run_model(const ModelConfig& trained, const std::optional<Config>& fallback) {
  if (!fallback) return trained;
  const ModelConfig& wanted = fallback->model;
  if (wanted.img_h == trained.img_h && wanted.img_w == trained.img_w) return trained;
  ModelConfig probe = wanted;
  probe.preset = trained.preset;
  probe.img_h = trained.img_h, probe.img_w = trained.img_w;
  auto model_fields = [](const ModelConfig& m) {
    json fields = to_json(m);
    for (auto it = fields.begin(); it != fields.end();) it = is_dropout_rate(it.key()) ? fields.erase(it) : ++it;
    return fields;
  };
  if (model_fields(probe) != model_fields(trained)) return trained;  // a config for the data, not for this model
  ModelConfig out = trained;
  out.img_h = wanted.img_h, out.img_w = wanted.img_w;
  return out;
}

// The file's position embedding `pos` for `target`'s grid, resampled from `old_grid` (nullopt: the square its rows
// make, as timm's checkpoint filter assumes) when the grid differs, with a line in `adapted`. Shapes that no grid
// explains are left for the caller's shape check to report.
torch::Tensor pos_embed_at(const torch::Tensor& pos, const ModelConfig& target,
                           std::optional<std::array<int64_t, 2>> old_grid, const std::string& path,
                           std::vector<std::string>& adapted) {
  const int64_t prefix = target.pos_embed_prefix();  // rows of the prefix tokens (none with no_embed_class)
  const int64_t rows = prefix + target.grid_h() * target.grid_w();
  if (pos.dim() != 3 || pos.size(0) != 1 || pos.size(2) != target.embed_dim || pos.size(1) == rows) return pos;
  const int64_t old_patches = pos.size(1) - prefix;
  if (!old_grid) {
    const auto side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(std::max<int64_t>(old_patches, 0)))));
    old_grid = std::array<int64_t, 2>{side, side};
  }
  const auto [old_h, old_w] = *old_grid;
  if (old_patches <= 0 || old_h * old_w != old_patches) {
    throw std::runtime_error(path + ": pos_embed with " + std::to_string(old_patches) +
                             " patch rows is not a square grid; cannot infer its size to resample it to " +
                             size_text(target.grid_h(), target.grid_w()));
  }
  if (target.rel_pos_bias) {
    throw std::runtime_error(path + ": trained for a " + size_text(old_h, old_w) +
                             " grid; a model with rel_pos_bias cannot be resized at load (its bias table belongs to "
                             "that grid): keep its img_size and run it at another one with --img-size");
  }
  adapted.push_back("pos_embed resampled from a " + size_text(old_h, old_w) + " to a " +
                    size_text(target.grid_h(), target.grid_w()) + " grid (" +
                    size_text(target.img_h, target.img_w) + " input), as timm's checkpoint filter does");
  return resample_pos_embed(pos, old_h, old_w, target.grid_h(), target.grid_w(), prefix);
}

// Builds `out.net` from `model` and reads every tensor through `read` (name, destination); pos_embed is read at the
// file's shape `shapes` gives and resampled to the model's grid when they differ (pos_embed_at).
template <typename Read>
void build_and_read(LoadedModel& out, const ModelConfig& model, std::map<std::string, std::vector<int64_t>> shapes,
                    const Read& read, std::optional<std::array<int64_t, 2>> old_grid, const std::string& path) {
  out.net = VisionTransformer(model, Init::none);
  auto targets = model_targets(out.net);
  torch::Tensor pos;
  auto file_pos = shapes.find("pos_embed");
  if (file_pos != shapes.end() && targets.count("pos_embed") &&
      targets.at("pos_embed").sizes() != c10::IntArrayRef(file_pos->second)) {
    auto raw = torch::empty(file_pos->second, torch::kFloat32);
    read("pos_embed", raw);
    pos = pos_embed_at(raw, model, old_grid, path, out.adapted);
    file_pos->second = pos.sizes().vec();
  }
  check_names_and_shapes(targets, shapes, path);
  torch::NoGradGuard no_grad;
  for (auto& [name, target] : targets) {
    if (name == "pos_embed" && pos.defined()) target.copy_(pos);
    else read(name, target);
  }
  out.net->eval();
}

std::array<int64_t, 2> grid_of(const ModelConfig& m) { return {m.grid_h(), m.grid_w()}; }

// A file's metadata (or a snapshot's config) may describe any model; a damaged or hostile one must not make us
// allocate what it claims. Its parameters are counted without building it (model/flops.h) and must fit in the
// file's tensor data at one byte each (U8, the smallest dtype) before the network is built.
void check_fits_file(const ModelConfig& described, uint64_t data_bytes, const std::string& path,
                     const std::string& described_by) {
  int64_t params = 0;
  for (const auto& cost : layer_costs(described)) params += cost.params;
  if (static_cast<uint64_t>(params) <= data_bytes) return;
  throw std::runtime_error(path + ": " + described_by + " describes a model of " + std::to_string(params) +
                           " parameters (embed_dim " + std::to_string(described.embed_dim) + ", depth " +
                           std::to_string(described.depth) + ", img_size " +
                           size_text(described.img_h, described.img_w) + "), but the file holds only " +
                           std::to_string(data_bytes) + " bytes of tensor data (damaged, or not this model's file)");
}

// A folder `vit train` wrote (README "Run directory": metrics.jsonl, state.safetensors, final.safetensors, ...) stands
// for its result: final.safetensors, the weights train.final_weights declared, else best.safetensors, the best on the
// validation split. Returns that file and a line for the log, or {"", ""} for a file or any other folder (a snapshot).
std::pair<std::string, std::string> run_folder_weights(const std::string& path) {
  if (!is_snapshot_dir(path)) return {"", ""};
  std::string dir = path;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const bool run = file_exists(dir + "/metrics.jsonl") || file_exists(dir + "/state.safetensors") ||
                   file_exists(dir + "/final.safetensors") || file_exists(dir + "/best.safetensors");
  if (!run || file_exists(dir + "/model.safetensors")) return {"", ""};
  if (file_exists(dir + "/final.safetensors")) {
    return {dir + "/final.safetensors",
            "the run folder's final.safetensors, the weights its train.final_weights declared"};
  }
  if (file_exists(dir + "/best.safetensors")) {
    return {dir + "/best.safetensors",
            "the run folder's best.safetensors, the best on its validation split (no final.safetensors: the run has "
            "not ended)"};
  }
  throw std::runtime_error(dir + ": a vit run folder with neither final.safetensors nor best.safetensors yet (the run "
                           "ended before its first evaluation); name one of its files, e.g. " + dir +
                           "/last.safetensors");
}

}  // namespace

LoadedModel load_model(const std::string& path, const std::optional<Config>& fallback) {
  if (const auto [weights, why] = run_folder_weights(path); !weights.empty()) {
    LoadedModel out = load_model(weights, fallback);
    out.adapted.insert(out.adapted.begin(), "loaded as " + why);
    out.sources.emplace_back("run folder", path);
    return out;
  }
  if (is_snapshot_dir(path)) {
    const Snapshot snapshot = read_snapshot(path);
    LoadedModel out;
    out.path = path;
    const ModelConfig model = run_model(snapshot.model, fallback);
    out.preprocess = snapshot.preprocess;
    out.class_names = snapshot.class_names;
    out.sources = snapshot.sources;
    out.sources.emplace_back("weights", snapshot.weights);
    const SnapshotWeights weights(snapshot);
    check_fits_file(snapshot.model, weights.data_size, snapshot.weights, "the snapshot's config");
    if (out.class_names.empty()) {
      out.class_names = numbered_classes(model.num_classes);
      out.sources.emplace_back("class_names", "numbered (the snapshot names none)");
    }
    build_and_read(
        out, model, weights.shapes(), [&](const std::string& name, torch::Tensor target) { weights.read_into(name, target); },
        grid_of(snapshot.model), snapshot.weights);
    if (model.img_h != snapshot.model.img_h || model.img_w != snapshot.model.img_w) {
      out.sources.emplace_back("img_size", "--config (" + size_text(model.img_h, model.img_w) + ")");
    }
    return out;
  }
  refuse_pickle(path);
  // Tensor by tensor from the file into the weights: the file's bytes are never held in memory beside them.
  const safetensors::File file(path);
  const auto& metadata = file.metadata();
  LoadedModel out;
  out.path = path;
  ModelConfig model;
  std::optional<std::array<int64_t, 2>> old_grid;  // the grid the file's pos_embed was made for, when it says
  auto format = metadata.find("format");
  if (format != metadata.end() && format->second == kModelFormat) {
    const auto& version = metadata_value(metadata, "format_version", path);
    if (version != std::to_string(kModelFormatVersion) && version != std::to_string(kModelFormatVersionInt8)) {
      throw std::runtime_error(path + ": model format version " + version + ", this vit reads versions " +
                               std::to_string(kModelFormatVersion) + " and " + std::to_string(kModelFormatVersionInt8) +
                               " (re-export it with a matching vit)");
    }
    if (version == std::to_string(kModelFormatVersionInt8)) {
      const auto precision = metadata.find("precision");
      if (precision == metadata.end() || precision->second != "int8") {
        throw std::runtime_error(path + ": model format version " + version + " needs metadata \"precision\": \"int8\"");
      }
      out.precision = Precision::int8;
    }
    out.has_metadata = true;
    const ModelConfig trained = parse_model_config(metadata_json(metadata, "model", path), path + " (metadata)");
    check_fits_file(trained, file.data_size(), path, "its metadata");
    old_grid = grid_of(trained);
    model = run_model(trained, fallback);
    out.preprocess = parse_preprocess(metadata_json(metadata, "preprocess", path), path + " (metadata)");
    const json names = metadata_json(metadata, "class_names", path);
    if (!names.is_array()) throw std::runtime_error(path + ": metadata class_names is not an array");
    for (const auto& n : names) out.class_names.push_back(n.is_string() ? n.get<std::string>() : n.dump());
    for (const char* part : {"model", "preprocess", "class_names"}) out.sources.emplace_back(part, "the file's metadata");
    if (model.img_h != trained.img_h || model.img_w != trained.img_w) {
      out.sources.emplace_back("img_size", "--config (" + size_text(model.img_h, model.img_w) + ")");
    }
  } else if (fallback) {
    model = fallback->model;
    out.preprocess = fallback->data.preprocess;
    for (const char* part : {"model", "preprocess"}) out.sources.emplace_back(part, "--config (the file has no vit metadata)");
  } else {
    throw std::runtime_error(path +
                             ": no vit metadata (a plain timm file?): pass --config with the model and preprocessing, "
                             "or the timm snapshot folder it came from");
  }
  if (static_cast<int64_t>(out.class_names.size()) != model.num_classes) {
    out.class_names = numbered_classes(model.num_classes);
    if (!out.has_metadata) out.sources.emplace_back("class_names", "numbered");
  }
  out.sources.emplace_back("weights", path);
  // An int8 file's scales are read with their weights, not as tensors of their own.
  const bool int8 = out.precision == Precision::int8;
  auto scale_of = [&](const std::string& name) { return int8 ? file.find(name + "_scale") : nullptr; };
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& info : file.tensors()) {
    const bool scale = int8 && info.name.size() > 6 && info.name.compare(info.name.size() - 6, 6, "_scale") == 0 &&
                       file.find(info.name.substr(0, info.name.size() - 6)) != nullptr;
    if (!scale) shapes[info.name] = info.shape;
  }
  build_and_read(
      out, model, shapes,
      [&](const std::string& name, torch::Tensor target) {
        const auto* info = file.find(name);
        if (const auto* scale = scale_of(name)) {
          if (info->dtype != safetensors::DType::I8) {
            throw std::runtime_error(path + ": " + name + " has a scale beside it but is " +
                                     safetensors::dtype_name(info->dtype) + ", not I8");
          }
          target.copy_(dequantized(file.tensor(*info, /*as_float32=*/false), file.tensor(*scale, /*as_float32=*/true),
                                   name, path));
        } else {
          file.read_into(*info, target);
        }
      },
      old_grid, path);
  return out;
}

void check_input_size(const ModelConfig& model, int64_t height, int64_t width, const std::string& what) {
  const int64_t P = model.patch_size;
  std::string problems;
  const std::vector<std::pair<std::string, int64_t>> sides =
      height == width ? std::vector<std::pair<std::string, int64_t>>{{"", height}}
                      : std::vector<std::pair<std::string, int64_t>>{{"height ", height}, {"width ", width}};
  for (const auto& [side, value] : sides) {
    if (value > 0 && value % P == 0) continue;
    const int64_t below = value / P * P, above = below + P;
    problems += (problems.empty() ? "" : "; ") + side + std::to_string(value) + " is not a multiple of the patch size " +
                std::to_string(P) + " (nearest valid: " + (below > 0 ? std::to_string(below) + " or " : "") +
                std::to_string(above) + ")";
  }
  if (!problems.empty()) throw std::invalid_argument(what + ": " + problems);
  // The same bounds as a config's img_size (config/model_config.h), so that no count of tokens or MACs can overflow.
  if (height > kMaxImageSide || width > kMaxImageSide || (height / P) * (width / P) > kMaxPatches) {
    throw std::invalid_argument(what + ": " + size_text(height, width) + " is too large (each side at most " +
                                std::to_string(kMaxImageSide) + ", at most " + std::to_string(kMaxPatches) +
                                " patches of " + std::to_string(P) + ")");
  }
}

LoadedModel load_model_at_size(const std::string& path, const std::optional<Config>& fallback, int64_t height,
                               int64_t width, const std::string& what) {
  LoadedModel own = load_model(path, fallback);
  const ModelConfig& built = own.net->config();
  check_input_size(built, height, width, what);
  if (built.img_h == height && built.img_w == width) return own;
  // The same model at the new size, as a --config would describe it: load_model builds it at that size and resamples
  // the file's position embedding for its grid.
  Config resized = fallback.value_or(Config{});
  resized.model = built;
  resized.model.img_h = height, resized.model.img_w = width;
  LoadedModel out = load_model(path, resized);
  const ModelConfig& rebuilt = out.net->config();
  if (rebuilt.img_h != height || rebuilt.img_w != width) {
    throw std::logic_error(path + ": loading at " + size_text(height, width) + " built " +
                           size_text(rebuilt.img_h, rebuilt.img_w));
  }
  return out;
}

ModelConfig LoadedModel::config() const {
  ModelConfig m = net->config();
  if (run_h > 0 && run_w > 0) m.img_h = run_h, m.img_w = run_w;
  return m;
}

std::string set_input_size(LoadedModel& model, int64_t height, int64_t width, const std::string& what) {
  const ModelConfig running = model.config();
  check_input_size(running, height, width, what);
  if (running.img_h == height && running.img_w == width) return "";
  const ModelConfig& own = model.net->config();
  const bool own_size = own.img_h == height && own.img_w == width;
  model.run_h = own_size ? 0 : height, model.run_w = own_size ? 0 : width;
  if (own_size) return "running at " + size_text(height, width) + ", its own size";
  const ModelConfig now = model.config();
  return "running at " + size_text(height, width) + " (a " + size_text(now.grid_h(), now.grid_w()) +
         " grid; the position embedding of the " + size_text(own.grid_h(), own.grid_w()) +
         " grid resampled at every forward pass, as timm's dynamic_img_size)";
}

std::vector<std::string> load_for_finetune(const std::string& path, VisionTransformer& net) {
  if (const auto [weights, why] = run_folder_weights(path); !weights.empty()) {
    auto notes = load_for_finetune(weights, net);
    notes.insert(notes.begin(), "loaded " + why);
    return notes;
  }
  std::map<std::string, torch::Tensor> tensors;
  std::optional<ModelConfig> trained;  // the source's architecture, when it says (for its grid)
  if (is_snapshot_dir(path)) {
    const Snapshot snapshot = read_snapshot(path);
    trained = snapshot.model;
    const SnapshotWeights weights(snapshot);
    for (const auto& [name, shape] : weights.shapes()) {
      auto tensor = torch::empty(shape, torch::kFloat32);
      weights.read_into(name, tensor);
      tensors[name] = tensor;
    }
  } else {
    refuse_pickle(path);
    const auto archive = safetensors::read(path);
    tensors = all_tensors(archive);
    const auto precision = archive.metadata.find("precision");
    if (precision != archive.metadata.end() && precision->second == "int8") dequantize_all(tensors, path);
    auto format = archive.metadata.find("format");
    if (format != archive.metadata.end() && format->second == kModelFormat) {
      trained = parse_model_config(metadata_json(archive.metadata, "model", path), path + " (metadata)");
    }
  }
  std::vector<std::string> adapted;
  const auto& config = net->config();
  // A different class count: keep the freshly initialised head.
  auto head_weight = tensors.find("head.weight");
  if (net->head && (head_weight == tensors.end() || head_weight->second.sizes() != net->head->weight.sizes())) {
    tensors["head.weight"] = net->head->weight.detach().clone();
    tensors["head.bias"] = net->head->bias.detach().clone();
    adapted.push_back("head re-initialised for " + std::to_string(config.num_classes) + " classes");
  }
  // A different grid: resample the position embedding (its prefix tokens kept).
  auto pos = tensors.find("pos_embed");
  if (pos != tensors.end()) {
    std::optional<std::array<int64_t, 2>> old_grid;
    if (trained) old_grid = grid_of(*trained);
    pos->second = pos_embed_at(pos->second, config, old_grid, path, adapted);
  }
  load_state(net, tensors, path);
  return adapted;
}

}  // namespace vit
