// `vit export`: our file, timm and Hugging Face snapshot folders (io/snapshot.h), ONNX (export/onnx_writer.h).
#include "export/export.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "io/snapshot.h"
#include "util/fs.h"
#include "util/log.h"

namespace vit {
namespace fs = std::filesystem;

namespace {

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// Creates `out`'s parent folders; `out` itself must not exist (a folder is never merged into or replaced).
void check_new_folder(const std::string& out) {
  if (path_exists(out)) {
    throw std::runtime_error(out + ": already exists (vit export writes a new folder; remove it or choose another --out)");
  }
  const auto parent = fs::path(out).parent_path();
  if (!parent.empty()) make_dirs(parent.string());
}

// The weights of a snapshot folder: model.safetensors, or, above max_shard_bytes (when not 0), shards named as
// transformers' save_pretrained names them (model-00001-of-00003.safetensors, ...) with model.safetensors.index.json
// giving each tensor's shard. Tensors go in order, a new shard when the next would pass the limit (a tensor larger
// than the limit gets a shard of its own), as transformers splits them.
void write_weights(const std::string& folder, const safetensors::NamedTensors& tensors, uint64_t max_shard_bytes) {
  const std::map<std::string, std::string> metadata{{"format", "pt"}};
  auto bytes_of = [](const torch::Tensor& t) { return static_cast<uint64_t>(t.numel()) * t.element_size(); };
  uint64_t total = 0;
  for (const auto& item : tensors) total += bytes_of(item.second);
  if (max_shard_bytes == 0 || total <= max_shard_bytes) {
    safetensors::write(folder + "/model.safetensors", tensors, metadata);
    return;
  }
  std::vector<safetensors::NamedTensors> shards(1);
  uint64_t size = 0;
  for (const auto& item : tensors) {
    if (!shards.back().empty() && size + bytes_of(item.second) > max_shard_bytes) {
      shards.emplace_back();
      size = 0;
    }
    shards.back().push_back(item);
    size += bytes_of(item.second);
  }
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    safetensors::write(folder + "/" + name, shards[i], metadata);
    for (const auto& item : shards[i]) weight_map[item.first] = name;
  }
  const nlohmann::json index{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_file_atomic(folder + "/model.safetensors.index.json", index.dump(2) + "\n");
}

// Writes the folder's files into a sibling temp folder and renames it to `out` at the end: an interrupted export
// leaves no partial folder under the final name.
void write_folder(const std::string& out, const std::map<std::string, nlohmann::json>& files,
                  const safetensors::NamedTensors& tensors, uint64_t max_shard_bytes) {
  check_new_folder(out);
  std::string trimmed = out;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const std::string temp = trimmed + ".partial-" + std::to_string(::getpid());
  std::error_code ignored;
  fs::remove_all(temp, ignored);
  try {
    make_dirs(temp);
    for (const auto& [name, doc] : files) write_file_atomic(temp + "/" + name, doc.dump(2) + "\n");
    write_weights(temp, tensors, max_shard_bytes);
    if (std::rename(temp.c_str(), trimmed.c_str()) != 0) {
      throw std::runtime_error(trimmed + ": cannot rename " + temp + " to it");
    }
  } catch (...) {
    fs::remove_all(temp, ignored);
    throw;
  }
}

// Our tensors under HF's names: each fused qkv split into query, key and value.
safetensors::NamedTensors hf_tensors(VisionTransformer& net) {
  safetensors::NamedTensors out;
  for (auto& [name, tensor] : state_tensors(net)) {
    if (name.find(".attn.qkv.") != std::string::npos) {
      const auto names = hf_qkv_names(name);
      const auto parts = tensor.chunk(3, 0);
      for (int i = 0; i < 3; ++i) out.emplace_back(names[i], parts[i].contiguous());
      continue;
    }
    const std::string theirs = hf_name(name);
    if (theirs.empty()) throw std::invalid_argument("hf format cannot represent the tensor " + name);
    out.emplace_back(theirs, tensor);
  }
  return out;
}

std::vector<std::string> export_onnx(LoadedModel& model, const ExportRequest& request) {
#if VIT_WITH_ONNX
  onnx::ExportInput input = onnx_export_input(model.net, request.attention);
  input.dynamic_size = request.dynamic_size;
  input.external_data = request.external_data;
  const auto& m = input.model;
  input.metadata = {{"vit.format", "vit-onnx"},
                    {"vit.version", VIT_VERSION},
                    {"model", to_json(m).dump()},
                    {"preprocess", to_json(model.preprocess).dump()},
                    {"class_names", nlohmann::json(model.class_names).dump()},
                    {"input_size", nlohmann::json::array({m.in_chans, m.img_h, m.img_w}).dump()},
                    {"mean", nlohmann::json(model.preprocess.mean).dump()},
                    {"std", nlohmann::json(model.preprocess.std).dump()}};
  const auto parent = fs::path(request.out).parent_path();
  if (!parent.empty()) make_dirs(parent.string());
  return onnx::write_onnx(input, request.out);
#else
  (void)model;
  throw std::runtime_error(request.out +
                           ": this vit was built without ONNX support (install libprotobuf-dev protobuf-compiler "
                           "libonnx-dev and rebuild)");
#endif
}

}  // namespace

#if VIT_WITH_ONNX
onnx::ExportInput onnx_export_input(VisionTransformer& net, bool attention_outputs) {
  torch::NoGradGuard no_grad;
  onnx::ExportInput input;
  input.model = net->config();
  input.attention_outputs = attention_outputs;
  auto add = [&](const std::string& name, const torch::Tensor& tensor) {
    const auto values = tensor.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    onnx::Weight w;
    w.shape = values.sizes().vec();
    w.data.assign(values.data_ptr<float>(), values.data_ptr<float>() + values.numel());
    input.weights[name] = std::move(w);
  };
  for (auto& [name, tensor] : state_tensors(net)) add(name, tensor);
  if (input.model.use_rot_pos_emb) {
    add("rope.table", net->rope->embed({input.model.grid_h(), input.model.grid_w()}));
    if (const auto frequencies = net->rope->frequencies(); frequencies.defined()) add("rope.frequencies", frequencies);
  }
  if (input.model.rel_pos_bias) {
    const std::array<int64_t, 2> grid{input.model.grid_h(), input.model.grid_w()};
    for (size_t i = 0; i < net->blocks->size(); ++i) {
      add("blocks." + std::to_string(i) + ".attn.relative_position_bias",
          net->blocks[i]->as<Block>()->attn->relative_bias(grid));
    }
  }
  return input;
}
#endif

bool onnx_export_available() { return VIT_WITH_ONNX; }

uint64_t parse_shard_size(const std::string& text) {
  static const std::vector<std::pair<std::string, uint64_t>> units{
      {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30}, {"KB", 1000},
      {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000}, {"", 1}};
  for (const auto& [unit, scale] : units) {
    if (text.size() <= unit.size() || text.compare(text.size() - unit.size(), unit.size(), unit) != 0) continue;
    const std::string digits = text.substr(0, text.size() - unit.size());
    uint64_t value = 0;
    if (digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos ||
        __builtin_mul_overflow(std::stoull(digits), scale, &value) || value == 0) {
      break;
    }
    return value;
  }
  throw std::invalid_argument("--max-shard-size: \"" + text +
                              "\" is not a size (bytes, or a number with KB, MB, GB, KiB, MiB or GiB, e.g. 5GB)");
}

std::vector<std::string> export_model(LoadedModel& model, const ExportRequest& request) {
  if (request.out.empty()) throw std::invalid_argument("vit export needs --out");
  if (request.attention && request.format != ExportFormat::onnx) {
    throw std::invalid_argument("--attention applies to --format onnx only");
  }
  if ((request.dynamic_size || request.external_data) && request.format != ExportFormat::onnx) {
    throw std::invalid_argument(std::string(request.dynamic_size ? "--dynamic-size" : "--external-data") +
                                " applies to --format onnx only");
  }
  if (request.max_shard_bytes != 0 && request.format != ExportFormat::timm && request.format != ExportFormat::hf) {
    throw std::invalid_argument("--max-shard-size applies to --format timm and hf (snapshot folders) only");
  }
  torch::NoGradGuard no_grad;
  model.net->eval();
  if (request.precision != Precision::fp32 && request.format != ExportFormat::vit) {
    throw std::invalid_argument(std::string("--precision ") + name_of(request.precision) +
                                " is written by --format vit only; " + name_of(request.format) + " holds float32");
  }
  if (model.preprocess.eval_hflip && request.format != ExportFormat::vit) {
    log::warn(model.path + ": eval_hflip (flip test-time augmentation) is not part of the exported " +
              name_of(request.format) + " model, which is the plain one: average each image's and its mirror's " +
              "logits to score as vit does");
  }
  switch (request.format) {
    case ExportFormat::vit: {
      if (is_snapshot_dir(request.out)) throw std::runtime_error(request.out + ": is a folder; --format vit writes a file");
      const auto parent = fs::path(request.out).parent_path();
      if (!parent.empty()) make_dirs(parent.string());
      save_model(request.out, model.net, model.preprocess, model.class_names, {}, request.precision);
      return {request.out};
    }
    case ExportFormat::timm: {
      const auto files = snapshot_files(SnapshotKind::timm, model.net->config(), model.preprocess, model.class_names);
      write_folder(request.out, files, state_tensors(model.net), request.max_shard_bytes);
      return {request.out};
    }
    case ExportFormat::hf: {
      const auto files = snapshot_files(SnapshotKind::hf, model.net->config(), model.preprocess, model.class_names);
      write_folder(request.out, files, hf_tensors(model.net), request.max_shard_bytes);
      return {request.out};
    }
    case ExportFormat::onnx:
      if (is_snapshot_dir(request.out)) throw std::runtime_error(request.out + ": is a folder; --format onnx writes a file");
      return export_onnx(model, request);
  }
  return {};
}

}  // namespace vit
