// Wiring shared by the subcommands.
#include "common.h"

#include <filesystem>
#include <sstream>

#include "util/fs.h"
#include "util/log.h"

namespace vit::app {

void add_config_args(CLI::App* command, ConfigArgs& args) {
  command->add_option("--config", args.config, "JSON config file (model, data, train sections)")
      ->check(CLI::ExistingFile);
  command->add_option("--set", args.overrides, "override a config value, e.g. --set model.depth=6 (repeatable)")
      ->allow_extra_args(false);
}

std::optional<Config> load_config_args(const ConfigArgs& args) {
  if (args.config.empty()) {
    if (!args.overrides.empty()) throw std::invalid_argument("--set needs --config");
    return std::nullopt;
  }
  return load_config(args.config, args.overrides);
}

std::string resolve_checkpoint(const std::string& checkpoint, const std::string& runs_root) {
  if (!checkpoint.empty()) return checkpoint;
  const std::string latest = runs_root + "/latest/best.safetensors";
  if (!file_exists(latest)) {
    throw std::invalid_argument("no --checkpoint given and no trained model at " + latest +
                                " (train one with `vit train`, or pass --checkpoint FILE)");
  }
  std::error_code error;
  const auto real = std::filesystem::canonical(latest, error);
  log::info("using the latest run's best model: " + (error ? latest : real.string()));
  return latest;
}

LoadedModel load_model_args(const std::string& checkpoint, const ConfigArgs& args) {
  const auto config = load_config_args(args);
  const std::string path =
      resolve_checkpoint(checkpoint, config ? config->train.output_root : std::string("runs"));
  return load_model(path, config);
}

std::map<int64_t, std::vector<int64_t>> parse_head_mask(const std::string& text) {
  std::map<int64_t, std::vector<int64_t>> out;
  std::stringstream list(text);
  std::string item;
  while (std::getline(list, item, ',')) {
    const auto colon = item.find(':');
    try {
      if (colon == std::string::npos) throw std::invalid_argument("");
      size_t used = 0;
      const int64_t layer = std::stoll(item.substr(0, colon), &used);
      if (used != colon) throw std::invalid_argument("");
      const std::string head_text = item.substr(colon + 1);
      const int64_t head = std::stoll(head_text, &used);
      if (used != head_text.size()) throw std::invalid_argument("");
      out[layer].push_back(head);
    } catch (const std::exception&) {
      throw std::invalid_argument("--mask-heads: \"" + item + "\" is not LAYER:HEAD (e.g. 3:1)");
    }
  }
  return out;
}

void add_device_args(CLI::App* command, std::string& device, int& threads) {
  command->add_option("--device", device, "auto | cpu | cuda | cuda:N")->capture_default_str();
  command->add_option("--threads", threads, "CPU threads (0 = all cores)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

}  // namespace vit::app
