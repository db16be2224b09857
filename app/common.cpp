// Wiring shared by the subcommands.
#include "common.h"

#include <cstdio>
#include <filesystem>
#include <sstream>

#include "commands.h"
#include "util/fs.h"
#include "util/log.h"
#include "util/runtime.h"

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

LoadedModel load_model_args(const std::string& checkpoint, const ConfigArgs& args, const std::string& img_size) {
  const auto config = load_config_args(args);
  const std::string path =
      resolve_checkpoint(checkpoint, config ? config->train.output_root : std::string("runs"));
  LoadedModel model;
  if (img_size.empty()) {
    model = load_model(path, config);
  } else {
    const auto size = parse_img_sizes(img_size, false).front();
    model = load_model_at_size(path, config, size[0], size[1], "--img-size " + size_option_text(size[0], size[1]));
  }
  for (const auto& note : model.adapted) log::info(model.path + ": " + note);
  return model;
}

std::vector<std::array<int64_t, 2>> parse_img_sizes(const std::string& text, bool allow_list) {
  std::vector<std::array<int64_t, 2>> out;
  std::stringstream list(text);
  std::string item;
  auto number = [&](const std::string& digits) {
    if (digits.empty() || digits.size() > 6 || digits.find_first_not_of("0123456789") != std::string::npos) {
      throw std::invalid_argument("--img-size: \"" + item + "\" is not N or HxW (e.g. 384 or 256x512)");
    }
    const int64_t value = std::stoll(digits);
    if (value <= 0) throw std::invalid_argument("--img-size: \"" + item + "\" has a zero side");
    return value;
  };
  while (std::getline(list, item, ',')) {
    const auto x = item.find('x');
    if (x == std::string::npos) {
      const int64_t side = number(item);
      out.push_back({side, side});
    } else {
      out.push_back({number(item.substr(0, x)), number(item.substr(x + 1))});
    }
  }
  if (out.empty()) throw std::invalid_argument("--img-size: \"" + text + "\" names no size");
  if (out.size() > 1 && !allow_list) {
    throw std::invalid_argument("--img-size: \"" + text + "\" lists several sizes; this command takes one");
  }
  return out;
}

void add_img_size_option(CLI::App* command, std::string& value, bool allow_list) {
  command->add_option("--img-size", value,
                      std::string("run the model at this input size: N or HxW, each side a multiple of the patch "
                                  "(default: the model's own); the position embedding is resampled as timm's "
                                  "dynamic_img_size") +
                          (allow_list ? "; a comma-separated list scores each size, e.g. 28,35,42" : ""));
}

void run_at_size(LoadedModel& model, std::array<int64_t, 2> size) {
  const std::string note = set_input_size(model, size[0], size[1], "--img-size " + size_option_text(size[0], size[1]));
  if (!note.empty()) log::info(model.path + ": " + note);
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

void add_image_limit_args(CLI::App* command, ImageLimits& limits) {
  command
      ->add_option_function<int64_t>(
          "--max-file-mb", [&limits](int64_t megabytes) { limits.max_file_bytes = megabytes << 20; },
          "refuse, unread, input files larger than this many MiB (default: " +
              std::to_string(limits.max_file_bytes >> 20) + ")")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  command
      ->add_option("--max-pixels", limits.max_pixels,
                   "refuse, undecoded, images whose header declares more pixels (width x height)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

int inputs_status(size_t failures, size_t inputs) {
  if (failures == 0) return kOk;
  return failures < inputs ? kPartial : kError;
}

void add_device_args(CLI::App* command, std::string& device, int& threads) {
  command->add_option("--device", device, "auto | cpu | cuda | cuda:N")->capture_default_str();
  command->add_option("--threads", threads, "CPU threads (0 = all cores)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

void add_precision_option(CLI::App* command, std::string& precision) {
  command
      ->add_option("--precision", precision,
                   "inference arithmetic: fp32 | int8 (CPU: int8 linear layers) | bf16 (CPU with AVX512_BF16 or AMX, "
                   "or CUDA) | fp16 (CUDA) (default: the model file's own, fp32 unless exported in int8)")
      ->check(enum_choice<Precision>());
}

Precision chosen_precision(const LoadedModel& model, const std::string& precision, torch::DeviceType device) {
  if (!precision.empty()) return *enum_from_name<Precision>(precision);
  // The file's own: where it cannot run, its weights (dequantized at load) run in float32.
  const auto refusal = precision_refusal(model.precision, device);
  if (refusal.empty()) return model.precision;
  log::warn(model.path + " holds " + name_of(model.precision) + " weights, run in float32 here: " + refusal);
  return Precision::fp32;
}

void apply_precision(LoadedModel& model, const std::string& precision) {
  const auto chosen = chosen_precision(model, precision, model.net->device().type());
  if (chosen == Precision::fp32 && model.net->precision() == Precision::fp32) return;
  const double before = static_cast<double>(model.net->weight_bytes()) / (1024.0 * 1024.0);
  model.net->set_precision(chosen);
  if (chosen == Precision::fp32) return;
  const double after = static_cast<double>(model.net->weight_bytes()) / (1024.0 * 1024.0);
  const std::string how = model.net->device().is_cpu() ? precision_kernel(chosen) : "CUDA autocast";
  char line[256];
  std::snprintf(line, sizeof line, "precision %s (%s): weights %.1f MiB -> %.1f MiB", name_of(chosen), how.c_str(),
                before, after);
  log::info(line);
}

void add_image_model_args(CLI::App* command, ImageModelArgs& args) {
  command->add_option("--checkpoint", args.checkpoint, kCheckpointHelp)->check(CLI::ExistingPath);
  add_config_args(command, args.config);
  add_img_size_option(command, args.img_size);
  add_image_limit_args(command, args.limits);
  add_device_args(command, args.device, args.threads);
  add_precision_option(command, args.precision);
  command->add_option("inputs", args.inputs, "image files or directories")->required();
}

LoadedModel load_image_model(const ImageModelArgs& args) {
  configure_threads(args.threads);
  auto model = load_model_args(args.checkpoint, args.config);
  if (!args.img_size.empty()) run_at_size(model, parse_img_sizes(args.img_size, false).front());
  return model;
}

void start_model(LoadedModel& model, const ImageModelArgs& args) {
  model.net->to(resolve_device(args.device));
  model.net->eval();
  apply_precision(model, args.precision);
}

std::vector<std::string> start_image_run(LoadedModel& model, const ImageModelArgs& args) {
  start_model(model, args);
  return expand_image_inputs(args.inputs);
}

void needs_opencv(const std::string& command) {
  throw std::runtime_error("this vit was built without OpenCV: " + command + " is unavailable");
}

}  // namespace vit::app
