// What `vit info` reports of a model: its config, preprocessing and class names, where each came from, its
// parameter count, the bytes its weights take in float32 and in a precision, its file's size, and per-layer costs at
// an input size. From a loaded model (file, snapshot or run folder) or from a config's model, built but not trained.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "config/config.h"
#include "io/model_file.h"
#include "model/flops.h"
#include "model/precision.h"

namespace vit {

struct ModelInfo {
  std::string source;  // the model file or folder, or the config file
  ModelConfig model;
  Preprocess preprocess;
  std::vector<std::string> class_names;                      // empty for a config
  std::vector<std::pair<std::string, std::string>> sources;  // ("model", "the file's metadata"), ... (loaded only)
  int64_t parameters = 0;
  Precision precision = Precision::fp32;
  int64_t weight_bytes = 0;       // in `precision`, packed as CPU inference packs them (CUDA autocast keeps float32)
  int64_t weight_bytes_fp32 = 0;
  int64_t file_bytes = -1;        // the model file's size; -1 for a snapshot folder or a config
  std::array<int64_t, 2> input_size{};  // where tokens and costs are counted
  int64_t tokens = 0;                   // per image at input_size, prefix tokens included
  double gmacs = 0;                     // forward GMACs per image at input_size
  std::vector<LayerCost> layers;
};

// `loaded` as it runs; its weights are packed in `precision` to count their bytes (they stay packed). `size`: count
// the costs at this input size instead of the model's own (checked: whole patches). Throws naming a bad size.
ModelInfo describe_model(LoadedModel& loaded, Precision precision,
                         const std::optional<std::array<int64_t, 2>>& size = std::nullopt);
// A config's model, built (not trained) to count its parameters and weight bytes exactly.
ModelInfo describe_model(const Config& config, const std::string& source, Precision precision,
                         const std::optional<std::array<int64_t, 2>>& size = std::nullopt);

// `vit info --json`'s object.
nlohmann::json to_json(const ModelInfo& info);

}  // namespace vit
