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

// Writes the folder's files into a sibling temp folder and renames it to `out` at the end: an interrupted export
// leaves no partial folder under the final name.
void write_folder(const std::string& out, const std::map<std::string, nlohmann::json>& files,
                  const safetensors::NamedTensors& tensors) {
  check_new_folder(out);
  std::string trimmed = out;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const std::string temp = trimmed + ".partial-" + std::to_string(::getpid());
  std::error_code ignored;
  fs::remove_all(temp, ignored);
  try {
    make_dirs(temp);
    for (const auto& [name, doc] : files) write_file_atomic(temp + "/" + name, doc.dump(2) + "\n");
    safetensors::write(temp + "/model.safetensors", tensors, {{"format", "pt"}});
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

void export_onnx(LoadedModel& model, const ExportRequest& request) {
#if VIT_WITH_ONNX
  onnx::ExportInput input = onnx_export_input(model.net, request.attention);
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
  onnx::write_onnx(input, request.out);
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

void export_model(LoadedModel& model, const ExportRequest& request) {
  if (request.out.empty()) throw std::invalid_argument("vit export needs --out");
  if (request.attention && request.format != ExportFormat::onnx) {
    throw std::invalid_argument("--attention applies to --format onnx only");
  }
  torch::NoGradGuard no_grad;
  model.net->eval();
  switch (request.format) {
    case ExportFormat::vit: {
      if (is_snapshot_dir(request.out)) throw std::runtime_error(request.out + ": is a folder; --format vit writes a file");
      const auto parent = fs::path(request.out).parent_path();
      if (!parent.empty()) make_dirs(parent.string());
      save_model(request.out, model.net, model.preprocess, model.class_names);
      return;
    }
    case ExportFormat::timm: {
      const auto files = snapshot_files(SnapshotKind::timm, model.net->config(), model.preprocess, model.class_names);
      write_folder(request.out, files, state_tensors(model.net));
      return;
    }
    case ExportFormat::hf: {
      const auto files = snapshot_files(SnapshotKind::hf, model.net->config(), model.preprocess, model.class_names);
      write_folder(request.out, files, hf_tensors(model.net));
      return;
    }
    case ExportFormat::onnx:
      if (is_snapshot_dir(request.out)) throw std::runtime_error(request.out + ": is a folder; --format onnx writes a file");
      export_onnx(model, request);
      return;
  }
}

}  // namespace vit
