// `vit info`: the resolved config, parameter count, forward GMACs per image and a per-layer table.
#include <cstdio>
#include <filesystem>
#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "io/snapshot.h"
#include "model/flops.h"

namespace vit::app {
namespace {

struct InfoOptions {
  std::string checkpoint;
  ConfigArgs config;
  bool json = false;
  bool presets = false;
  std::string img_size;  // --img-size: tokens and MACs at this input size
  std::string precision;  // --precision: the memory the weights take in it ("" = the model file's own)
};

int run_info(const InfoOptions& options) {
  if (options.presets) {
    for (const auto& name : preset_names()) std::cout << name << "\n";
    return kOk;
  }
  ModelConfig model;
  Preprocess preprocess;
  std::vector<std::string> classes;
  int64_t params = 0;
  int64_t fp32_bytes = 0, weight_bytes = 0;  // what the weights take in float32 and in --precision
  int64_t file_bytes = -1;                   // the model file's size (not for a snapshot folder)
  auto precision = options.precision.empty() ? Precision::fp32 : *enum_from_name<Precision>(options.precision);
  std::string source;
  std::vector<std::pair<std::string, std::string>> sources;
  if (!options.checkpoint.empty()) {
    auto loaded = load_model_args(options.checkpoint, options.config);
    model = loaded.config(), preprocess = loaded.preprocess, classes = loaded.class_names;
    params = count_parameters(*loaded.net);
    fp32_bytes = weight_bytes = loaded.net->weight_bytes();
    precision = chosen_precision(loaded, options.precision, torch::kCPU);
    if (!is_snapshot_dir(loaded.path)) file_bytes = static_cast<int64_t>(std::filesystem::file_size(loaded.path));
    if (precision != Precision::fp32) {
      loaded.net->set_precision(precision);  // packed as inference would pack them (CPU; CUDA autocast keeps float32)
      weight_bytes = loaded.net->weight_bytes();
    }
    source = loaded.path;
    sources = loaded.sources;
  } else {
    const auto config = load_config_args(options.config);
    if (!config) throw std::invalid_argument("vit info needs --checkpoint FILE or --config FILE");
    model = config->model, preprocess = config->data.preprocess;
    torch::NoGradGuard no_grad;
    VisionTransformer net(model);  // built only to count parameters and weight bytes exactly
    params = count_parameters(*net);
    fp32_bytes = weight_bytes = net->weight_bytes();
    if (precision != Precision::fp32) {
      net->set_precision(precision);
      weight_bytes = net->weight_bytes();
    }
    source = options.config.config;
  }
  // Costs at the model's own size or at --img-size (parameters stay those of the model as built).
  std::array<int64_t, 2> size{model.img_h, model.img_w};
  if (!options.img_size.empty()) {
    size = parse_img_sizes(options.img_size, /*allow_list=*/false).front();
    check_input_size(model, size[0], size[1], "--img-size " + size_option_text(size[0], size[1]));
  }
  const int64_t tokens = (size[0] / model.patch_size) * (size[1] / model.patch_size) + model.num_prefix_tokens();
  const auto costs = layer_costs(model, size[0], size[1]);
  const double gmacs = static_cast<double>(forward_macs(model, size[0], size[1])) / 1e9;
  if (options.json) {
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& c : costs) layers.push_back({{"name", c.name}, {"output", c.output}, {"params", c.params}, {"macs", c.macs}});
    nlohmann::json out{{"source", source},           {"model", to_json(model)},  {"preprocess", to_json(preprocess)},
                       {"parameters", params},       {"gmacs", gmacs},           {"layers", layers},
                       {"input_size", {size[0], size[1]}}, {"tokens", tokens},
                       {"precision", name_of(precision)}, {"weight_bytes", weight_bytes},
                       {"weight_bytes_fp32", fp32_bytes}};
    if (file_bytes >= 0) out["file_bytes"] = file_bytes;
    if (!classes.empty()) out["class_names"] = classes;
    for (const auto& [part, from] : sources) out["sources"][part] = from;
    std::cout << out.dump(2) << "\n";
    return kOk;
  }
  std::cout << "source      " << source << "\n"
            << "model       " << to_json(model).dump() << "\n"
            << "preprocess  " << to_json(preprocess).dump() << "\n";
  for (const auto& [part, from] : sources) std::printf("  %-11s from %s\n", part.c_str(), from.c_str());
  if (!classes.empty()) {
    std::cout << "classes     " << classes.size() << ":";
    for (size_t i = 0; i < classes.size() && i < 10; ++i) std::cout << " " << classes[i];
    if (classes.size() > 10) std::cout << " ...";
    std::cout << "\n";
  }
  std::printf("parameters  %lld\n", static_cast<long long>(params));
  const double mib = 1024.0 * 1024.0;
  if (precision == Precision::fp32) {
    std::printf("weights     %.1f MiB float32\n", static_cast<double>(fp32_bytes) / mib);
  } else {
    std::printf("weights     %.1f MiB in %s (%.2fx of float32's %.1f MiB)\n", static_cast<double>(weight_bytes) / mib,
                name_of(precision), static_cast<double>(weight_bytes) / static_cast<double>(fp32_bytes),
                static_cast<double>(fp32_bytes) / mib);
  }
  if (file_bytes >= 0) {
    std::printf("file        %.1f MiB (%.2fx of the float32 weights)\n", static_cast<double>(file_bytes) / mib,
                static_cast<double>(file_bytes) / static_cast<double>(fp32_bytes));
  }
  std::printf("forward     %.3f GMACs per image (%lldx%lld input, %lld tokens)\n\n",
              gmacs, static_cast<long long>(size[0]), static_cast<long long>(size[1]),
              static_cast<long long>(tokens));
  std::printf("%-26s %-12s %12s %14s\n", "layer", "output", "params", "MMACs");
  for (const auto& c : costs) {
    std::printf("%-26s %-12s %12lld %14.3f\n", c.name.c_str(), c.output.c_str(), static_cast<long long>(c.params),
                static_cast<double>(c.macs) / 1e6);
  }
  return kOk;
}

}  // namespace

void setup_info(CLI::App& app, int& status) {
  auto options = std::make_shared<InfoOptions>();
  auto* command = app.add_subcommand("info", "Show a model's config, parameter count, GMACs and layers");
  command->add_option("--checkpoint", options->checkpoint, "model file or timm / Hugging Face snapshot folder")
      ->check(CLI::ExistingPath);
  add_config_args(command, options->config);
  command->add_flag("--json", options->json, "print one JSON object");
  command->add_option("--img-size", options->img_size,
                      "show tokens, output shapes and GMACs at this input size: N or HxW (default: the model's own)");
  add_precision_option(command, options->precision);
  command->add_flag("--presets", options->presets,
                    "list the model presets (timm's architecture names that vit builds) and exit");
  command->callback([options, &status] { status = run_info(*options); });
}

}  // namespace vit::app
