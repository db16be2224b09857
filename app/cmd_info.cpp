// `vit info`: the resolved config, parameter count, forward GMACs per image and a per-layer table
// (io/model_info.h gathers them; this file prints them); `vit info --system`: this machine and the paths vit takes on
// it (model/system_info.h).
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "io/model_info.h"
#include "model/system_info.h"
#include "util/runtime.h"

namespace vit::app {
namespace {

struct InfoOptions {
  std::string checkpoint;
  ConfigArgs config;
  bool json = false;
  bool presets = false;
  bool system = false;
  std::string img_size;  // --img-size: tokens and MACs at this input size
  std::string precision;  // --precision: the memory the weights take in it ("" = the model file's own)
};

int run_info(const InfoOptions& options) {
  if (options.system) {
    configure_threads(0);  // the commands' default: every core
    const auto system = describe_system();
    std::cout << (options.json ? to_json(system).dump(2) + "\n" : to_text(system));
    return kOk;
  }
  if (options.presets) {
    for (const auto& name : preset_names()) std::cout << name << "\n";
    return kOk;
  }
  std::optional<std::array<int64_t, 2>> size;  // --img-size: costs at this input size
  if (!options.img_size.empty()) size = parse_img_sizes(options.img_size, /*allow_list=*/false).front();
  ModelInfo info;
  if (!options.checkpoint.empty()) {
    auto loaded = load_model_args(options.checkpoint, options.config);
    info = describe_model(loaded, chosen_precision(loaded, options.precision, torch::kCPU), size);
  } else {
    const auto config = load_config_args(options.config);
    if (!config) throw std::invalid_argument("vit info needs --checkpoint FILE or --config FILE");
    const auto precision = options.precision.empty() ? Precision::fp32 : *enum_from_name<Precision>(options.precision);
    info = describe_model(*config, options.config.config, precision, size);
  }
  if (options.json) {
    std::cout << to_json(info).dump(2) << "\n";
    return kOk;
  }
  std::cout << "source      " << info.source << "\n"
            << "model       " << to_json(info.model).dump() << "\n"
            << "preprocess  " << to_json(info.preprocess).dump() << "\n";
  for (const auto& [part, from] : info.sources) std::printf("  %-11s from %s\n", part.c_str(), from.c_str());
  if (!info.class_names.empty()) {
    std::cout << "classes     " << info.class_names.size() << ":";
    for (size_t i = 0; i < info.class_names.size() && i < 10; ++i) std::cout << " " << info.class_names[i];
    if (info.class_names.size() > 10) std::cout << " ...";
    std::cout << "\n";
  }
  std::printf("parameters  %lld\n", static_cast<long long>(info.parameters));
  const double mib = 1024.0 * 1024.0;
  const auto fp32 = static_cast<double>(info.weight_bytes_fp32);
  if (info.precision == Precision::fp32) {
    std::printf("weights     %.1f MiB float32\n", fp32 / mib);
  } else {
    std::printf("weights     %.1f MiB in %s (%.2fx of float32's %.1f MiB)\n", static_cast<double>(info.weight_bytes) / mib,
                name_of(info.precision), static_cast<double>(info.weight_bytes) / fp32, fp32 / mib);
  }
  if (info.file_bytes >= 0) {
    std::printf("file        %.1f MiB (%.2fx of the float32 weights)\n", static_cast<double>(info.file_bytes) / mib,
                static_cast<double>(info.file_bytes) / fp32);
  }
  std::printf("forward     %.3f GMACs per image (%lldx%lld input, %lld tokens)\n\n", info.gmacs,
              static_cast<long long>(info.input_size[0]), static_cast<long long>(info.input_size[1]),
              static_cast<long long>(info.tokens));
  std::printf("%-26s %-12s %12s %14s\n", "layer", "output", "params", "MMACs");
  for (const auto& c : info.layers) {
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
  command->add_flag("--system", options->system,
                    "describe this machine instead: CPU, the instruction sets vit and oneDNN use on it, which "
                    "precisions run and how, threads, library versions, CUDA devices (what a bug report needs)");
  command->add_flag("--presets", options->presets,
                    "list the model presets (timm's architecture names that vit builds) and exit");
  command->callback([options, &status] { status = run_info(*options); });
}

}  // namespace vit::app
