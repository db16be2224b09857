// Model files: one .safetensors file is a complete model: tensors under timm's names plus `__metadata__` with the
// format version, the resolved model config, the preprocessing and the class names.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/vit.h"

namespace vit {

inline constexpr const char* kModelFormat = "vit-model";
inline constexpr int kModelFormatVersion = 1;  // float32 weights
// An int8 file (vit export --format vit --precision int8): every weight VisionTransformerImpl::quantized_weight_names
// lists is stored in int8 with "<name>_scale" beside it (float32, one per output row: weight = int8 x scale), the
// rest in float32, and metadata "precision": "int8". A new version, so that a vit from before int8 files refuses one
// by its version rather than misreading it.
inline constexpr int kModelFormatVersionInt8 = 2;

struct LoadedModel {
  VisionTransformer net{nullptr};
  // The input size it runs at, where set_input_size chose one other than the network's own (0 x 0: its own). The
  // network resamples its position embedding for that grid at every forward pass.
  int64_t run_h = 0, run_w = 0;
  Preprocess preprocess;
  std::vector<std::string> class_names;  // size num_classes
  std::string path;
  bool has_metadata = false;  // false for a plain timm file (config came from --config)
  // Where the model, the preprocessing and the class names came from, for `vit info`: ("model", "..."), ...
  std::vector<std::pair<std::string, std::string>> sources;
  std::vector<std::string> adapted;  // what loading changed (a position embedding resampled), one line each, for the log
  // The precision the file was written in (int8 for an int8 model file, whose weights load dequantized into
  // float32): what inference uses unless --precision says otherwise.
  Precision precision = Precision::fp32;

  // The model as it runs: the network's config at the input size it runs at. Preprocessing, maps and costs read
  // this; the network's own size (its position embedding's grid, what a saved file holds) is net->config()'s.
  ModelConfig config() const;
};

// Writes the model's state dict (float32, timm names; with Precision::int8 the quantized weights in int8, see
// kModelFormatVersionInt8) and our metadata atomically. Other precisions are refused.
void save_model(const std::string& path, VisionTransformer& net, const Preprocess& preprocess,
                const std::vector<std::string>& class_names, const std::map<std::string, std::string>& extra = {},
                Precision precision = Precision::fp32);

// Rebuilds a model from a file or a snapshot folder alone: our own file, or a timm or Hugging Face snapshot folder
// (io/snapshot.h: config and preprocessing from its JSON files). A run folder of `vit train` loads its
// final.safetensors, else its best.safetensors, first in `adapted` (which file, and why) and in `sources`. A plain timm file needs `fallback` (from --config)
// for the architecture and preprocessing. A self-describing file or folder keeps its own architecture; `fallback`'s
// model section applies to it only when it describes the same model at another img_size. Either way, a position
// embedding made for another grid is resampled at load as timm's checkpoint filter does (bicubic, antialiased, prefix
// rows kept; a plain file's grid is taken as square, as timm takes it), noted in `adapted`. Half-precision tensors
// load into float32. A pickle checkpoint is refused, never unpickled. Missing/unexpected tensors and wrong shapes are
// listed by name.
LoadedModel load_model(const std::string& path, const std::optional<Config>& fallback = std::nullopt);

// load_model with the network built at `height` x `width` as its own size: the position embedding resampled once, as
// load_model does for a --config at another img_size (`vit export --img-size`), where set_input_size resamples at
// every forward pass. Checks the size (check_input_size, naming `what`).
LoadedModel load_model_at_size(const std::string& path, const std::optional<Config>& fallback, int64_t height,
                               int64_t width, const std::string& what);

// Throws std::invalid_argument when `height` x `width` is not a grid of whole patches of `model`, naming the nearest
// valid sizes; `what` starts the message (e.g. "--img-size 30").
void check_input_size(const ModelConfig& model, int64_t height, int64_t width, const std::string& what);

// Runs `model` at another input size from now on, as timm's dynamic_img_size: model.config() takes the size, the
// network keeps its weights and resamples its position embedding for the new grid at every forward pass (the
// network's own size is unchanged bit for bit). Checks the size (check_input_size). Returns a line for the log, ""
// when the model already runs at that size.
std::string set_input_size(LoadedModel& model, int64_t height, int64_t width, const std::string& what);

// Copies the tensors of `path` (a model file, a snapshot folder or a run folder, as load_model) into `net` for
// fine-tuning: the head is left as initialised when its class count differs, the position embedding is resampled
// when the grid differs. Returns what was adapted (for the log).
std::vector<std::string> load_for_finetune(const std::string& path, VisionTransformer& net);

// Copies named tensors into the model's parameters and buffers; throws listing every missing, unexpected and
// mis-shaped tensor.
void load_state(VisionTransformer& net, const std::map<std::string, torch::Tensor>& tensors, const std::string& path);

// The model's tensors under timm's names, in registration order, as contiguous float32 CPU tensors.
std::vector<std::pair<std::string, torch::Tensor>> state_tensors(VisionTransformer& net);

}  // namespace vit
