// What `vit info` reports of a model (io/model_info.h).
#include "io/model_info.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "io/snapshot.h"
#include "util/text.h"

namespace vit {
namespace {

// The costs part: tokens, GMACs and the layer table at the model's own size or at `size`.
void count_costs(ModelInfo& info, const std::optional<std::array<int64_t, 2>>& size) {
  const ModelConfig& m = info.model;
  info.input_size = {m.img_h, m.img_w};
  if (size) {
    check_input_size(m, (*size)[0], (*size)[1], "--img-size " + size_option_text((*size)[0], (*size)[1]));
    info.input_size = *size;
  }
  const auto [h, w] = info.input_size;
  info.tokens = (h / m.patch_size) * (w / m.patch_size) + m.num_prefix_tokens();
  info.layers = layer_costs(m, h, w);
  info.gmacs = static_cast<double>(forward_macs(m, h, w)) / 1e9;
}

// Parameters and weight bytes of `net`, whose weights are packed in `precision` for the second count.
void count_weights(ModelInfo& info, VisionTransformer& net, Precision precision) {
  info.parameters = count_parameters(*net);
  info.weight_bytes_fp32 = info.weight_bytes = net->weight_bytes();
  info.precision = precision;
  if (precision != Precision::fp32) {
    net->set_precision(precision);
    info.weight_bytes = net->weight_bytes();
  }
}

}  // namespace

ModelInfo describe_model(LoadedModel& loaded, Precision precision,
                         const std::optional<std::array<int64_t, 2>>& size) {
  ModelInfo info;
  info.source = loaded.path;
  info.model = loaded.config();
  info.preprocess = loaded.preprocess;
  info.class_names = loaded.class_names;
  info.sources = loaded.sources;
  count_weights(info, loaded.net, precision);
  if (!is_snapshot_dir(loaded.path)) info.file_bytes = static_cast<int64_t>(std::filesystem::file_size(loaded.path));
  count_costs(info, size);
  return info;
}

ModelInfo describe_model(const Config& config, const std::string& source, Precision precision,
                         const std::optional<std::array<int64_t, 2>>& size) {
  ModelInfo info;
  info.source = source;
  info.model = config.model;
  info.preprocess = config.data.preprocess;
  torch::NoGradGuard no_grad;
  VisionTransformer net(config.model);
  count_weights(info, net, precision);
  count_costs(info, size);
  return info;
}

nlohmann::json to_json(const ModelInfo& info) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& c : info.layers) {
    layers.push_back({{"name", c.name}, {"output", c.output}, {"params", c.params}, {"macs", c.macs}});
  }
  nlohmann::json out{{"source", info.source},
                     {"model", to_json(info.model)},
                     {"preprocess", to_json(info.preprocess)},
                     {"parameters", info.parameters},
                     {"gmacs", info.gmacs},
                     {"layers", layers},
                     {"input_size", {info.input_size[0], info.input_size[1]}},
                     {"tokens", info.tokens},
                     {"precision", name_of(info.precision)},
                     {"weight_bytes", info.weight_bytes},
                     {"weight_bytes_fp32", info.weight_bytes_fp32}};
  if (info.file_bytes >= 0) out["file_bytes"] = info.file_bytes;
  if (!info.class_names.empty()) out["class_names"] = info.class_names;
  for (const auto& [part, from] : info.sources) out["sources"][part] = from;
  return out;
}

}  // namespace vit
