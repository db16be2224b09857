// Model files: save and load complete, self-describing models in safetensors (timm-compatible tensor names).
#include "io/model_file.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "io/snapshot.h"

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
                const std::vector<std::string>& class_names, const std::map<std::string, std::string>& extra) {
  std::map<std::string, std::string> metadata = extra;
  metadata["format"] = kModelFormat;
  metadata["format_version"] = std::to_string(kModelFormatVersion);
  metadata["model"] = to_json(net->config()).dump();
  metadata["preprocess"] = to_json(preprocess).dump();
  metadata["class_names"] = json(class_names).dump();
  safetensors::write(path, state_tensors(net), metadata);
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

// For each of our tensor names, the snapshot tensors it is made of (one, or HF's query, key and value stacked).
struct SnapshotWeights {
  const safetensors::File file;
  std::map<std::string, std::vector<const safetensors::TensorInfo*>> parts;

  explicit SnapshotWeights(const Snapshot& snapshot) : file(snapshot.weights) {
    std::vector<std::string> names;
    for (const auto& info : file.tensors()) names.push_back(info.name);
    for (const auto& [ours, theirs] : snapshot_names(snapshot.kind, names, snapshot.weights)) {
      for (const auto& name : theirs) parts[ours].push_back(file.find(name));
    }
  }
  // Our name -> shape (stacked parts along dim 0); a stack of mismatched parts fails naming them.
  std::map<std::string, std::vector<int64_t>> shapes() const {
    std::map<std::string, std::vector<int64_t>> out;
    for (const auto& [ours, infos] : parts) {
      std::vector<int64_t> shape = infos[0]->shape;
      for (size_t i = 1; i < infos.size(); ++i) {
        auto rest = infos[i]->shape;
        if (rest.empty() || shape.empty() || std::vector<int64_t>(rest.begin() + 1, rest.end()) !=
                                                 std::vector<int64_t>(shape.begin() + 1, shape.end())) {
          throw std::runtime_error(file.path() + ": " + infos[0]->name + " and " + infos[i]->name +
                                   " have shapes that do not stack into " + ours);
        }
        shape[0] += rest[0];
      }
      out[ours] = shape;
    }
    return out;
  }
  void read_into(const std::string& ours, torch::Tensor target) const {
    int64_t row = 0;
    for (const auto* info : parts.at(ours)) {
      const int64_t rows = info->shape.empty() ? 1 : info->shape[0];
      file.read_into(*info, parts.at(ours).size() == 1 ? target : target.narrow(0, row, rows));
      row += rows;
    }
  }
};

}  // namespace

LoadedModel load_model(const std::string& path, const std::optional<Config>& fallback) {
  if (is_snapshot_dir(path)) {
    const Snapshot snapshot = read_snapshot(path);
    LoadedModel out;
    out.path = path;
    out.model = snapshot.model;
    out.preprocess = snapshot.preprocess;
    out.class_names = snapshot.class_names;
    out.sources = snapshot.sources;
    out.sources.emplace_back("weights", snapshot.weights);
    if (out.class_names.empty()) {
      out.class_names = numbered_classes(out.model.num_classes);
      out.sources.emplace_back("class_names", "numbered (the snapshot names none)");
    }
    out.net = VisionTransformer(out.model, Init::none);
    const SnapshotWeights weights(snapshot);
    auto targets = model_targets(out.net);
    check_names_and_shapes(targets, weights.shapes(), snapshot.weights);
    torch::NoGradGuard no_grad;
    for (auto& [name, target] : targets) weights.read_into(name, target);
    out.net->eval();
    return out;
  }
  refuse_pickle(path);
  // Tensor by tensor from the file into the weights: the file's bytes are never held in memory beside them.
  const safetensors::File file(path);
  const auto& metadata = file.metadata();
  LoadedModel out;
  out.path = path;
  auto format = metadata.find("format");
  if (format != metadata.end() && format->second == kModelFormat) {
    const auto& version = metadata_value(metadata, "format_version", path);
    if (version != std::to_string(kModelFormatVersion)) {
      throw std::runtime_error(path + ": model format version " + version + ", this vit reads version " +
                               std::to_string(kModelFormatVersion) + " (re-export it with a matching vit)");
    }
    out.has_metadata = true;
    out.model = parse_model_config(metadata_json(metadata, "model", path), path + " (metadata)");
    out.preprocess = parse_preprocess(metadata_json(metadata, "preprocess", path), path + " (metadata)");
    const json names = metadata_json(metadata, "class_names", path);
    if (!names.is_array()) throw std::runtime_error(path + ": metadata class_names is not an array");
    for (const auto& n : names) out.class_names.push_back(n.is_string() ? n.get<std::string>() : n.dump());
    for (const char* part : {"model", "preprocess", "class_names"}) out.sources.emplace_back(part, "the file's metadata");
  } else if (fallback) {
    out.model = fallback->model;
    out.preprocess = fallback->data.preprocess;
    for (const char* part : {"model", "preprocess"}) out.sources.emplace_back(part, "--config (the file has no vit metadata)");
  } else {
    throw std::runtime_error(path +
                             ": no vit metadata (a plain timm file?): pass --config with the model and preprocessing, "
                             "or the timm snapshot folder it came from");
  }
  if (static_cast<int64_t>(out.class_names.size()) != out.model.num_classes) {
    out.class_names = numbered_classes(out.model.num_classes);
    if (!out.has_metadata) out.sources.emplace_back("class_names", "numbered");
  }
  out.sources.emplace_back("weights", path);
  out.net = VisionTransformer(out.model, Init::none);
  auto targets = model_targets(out.net);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& info : file.tensors()) shapes[info.name] = info.shape;
  check_names_and_shapes(targets, shapes, path);
  torch::NoGradGuard no_grad;
  for (auto& [name, target] : targets) file.read_into(*file.find(name), target);
  out.net->eval();
  return out;
}

std::vector<std::string> load_for_finetune(const std::string& path, VisionTransformer& net) {
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
  if (pos != tensors.end() && pos->second.sizes() != net->pos_embed.sizes()) {
    const int64_t prefix = config.pos_embed_prefix();  // rows of the prefix tokens (none with no_embed_class)
    const int64_t old_patches = pos->second.size(1) - prefix;
    int64_t old_h = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(old_patches))));
    int64_t old_w = old_h;
    if (trained) old_h = trained->grid_h(), old_w = trained->grid_w();
    if (old_h * old_w != old_patches) {
      throw std::runtime_error(path + ": pos_embed with " + std::to_string(old_patches) +
                               " patches is not a square grid; cannot infer its size");
    }
    pos->second = resample_pos_embed(pos->second, old_h, old_w, config.grid_h(), config.grid_w(), prefix);
    adapted.push_back("pos_embed resampled from " + std::to_string(old_h) + "x" + std::to_string(old_w) +
                      " to " + std::to_string(config.grid_h()) + "x" + std::to_string(config.grid_w()));
  }
  load_state(net, tensors, path);
  return adapted;
}

}  // namespace vit
