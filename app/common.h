// Wiring shared by the subcommands: config/--set options, model lookup, device and thread options.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "config/config.h"
#include "data/image.h"
#include "io/model_file.h"
#include "util/text.h"

namespace vit::app {

struct ConfigArgs {
  std::string config;                  // --config FILE
  std::vector<std::string> overrides;  // --set key=value (repeatable)
};
void add_config_args(CLI::App* command, ConfigArgs& args);
// The config from --config (+ --set), or nullopt when no --config was given (--set alone is an error).
std::optional<Config> load_config_args(const ConfigArgs& args);

// --checkpoint's help, the same for every command that loads a model.
inline constexpr const char* kCheckpointHelp =
    "model file, timm / Hugging Face snapshot folder, or vit train's run folder (its final.safetensors) (default: the "
    "latest run's best model)";
// --checkpoint given: that file. Otherwise the newest run's best model (runs/latest/best.safetensors), logged.
std::string resolve_checkpoint(const std::string& checkpoint, const std::string& runs_root = "runs");
// Loads the model named by --checkpoint (or the latest run's), with --config for plain timm files; built at
// `img_size` ("N" or "HxW", vit export's --img-size) as its own size when that is not empty.
LoadedModel load_model_args(const std::string& checkpoint, const ConfigArgs& args, const std::string& img_size = "");

// --img-size: "N" (square) or "HxW"; with allow_list, a comma-separated list of them ("28,35,42"). Throws naming the
// bad item. Each is (height, width).
std::vector<std::array<int64_t, 2>> parse_img_sizes(const std::string& text, bool allow_list);
// Adds --img-size to a command that runs a loaded model (predict, evaluate, export-attention).
void add_img_size_option(CLI::App* command, std::string& value, bool allow_list = false);
// Runs `model` at `size` (set_input_size), logging what changed.
void run_at_size(LoadedModel& model, std::array<int64_t, 2> size);

// --mask-heads "1:0,1:2,3:1" -> {layer: [heads]}; throws naming the bad item.
std::map<int64_t, std::vector<int64_t>> parse_head_mask(const std::string& text);

// Accepts exactly the spellings of enum E (config/enum_names.h), naming them when another is given.
template <typename E>
CLI::Validator enum_choice() {
  const auto& names = EnumNames<E>::names;
  return CLI::IsMember(std::vector<std::string>(names.begin(), names.end()));
}

void add_device_args(CLI::App* command, std::string& device, int& threads);
// --precision fp32 | int8 | bf16 | fp16 (model/precision.h): inference's arithmetic.
void add_precision_option(CLI::App* command, std::string& precision);
// The precision to run `model` in on `device`: --precision when given (refused later, by name, where it cannot run),
// else the model file's own (LoadedModel::precision) where it can run, else float32 with a warning.
Precision chosen_precision(const LoadedModel& model, const std::string& precision, torch::DeviceType device);
// Runs the model in chosen_precision on the device it is on now (model/precision.h's refusal thrown where an asked-for
// one cannot run), logging the instructions used and what the weights take.
void apply_precision(LoadedModel& model, const std::string& precision);
// --max-file-mb and --max-pixels: the limits checked on every input image before it is decoded (predict, embed,
// export-attention).
void add_image_limit_args(CLI::App* command, ImageLimits& limits);
// The exit status of a command over many inputs: ok, partial (3) when some failed, an error (1) when all did.
int inputs_status(size_t failures, size_t inputs);

// What the commands that run a model over image files share (predict, embed, export-attention): the model, its
// input size, the limits on each input, where it runs, and the files and folders to read.
struct ImageModelArgs {
  std::string checkpoint;
  ConfigArgs config;
  std::string img_size;  // --img-size (default: the model's own)
  ImageLimits limits;    // --max-file-mb, --max-pixels
  std::string device = "auto";
  int threads = 0;
  std::string precision;  // --precision ("" = the model file's own)
  std::vector<std::string> inputs;
};
// --checkpoint, --config / --set, --img-size, --max-file-mb, --max-pixels, --device, --threads, --precision and the
// inputs.
void add_image_model_args(CLI::App* command, ImageModelArgs& args);
// Threads set, the model loaded (--checkpoint, --config) and run at --img-size: ready for a command's own checks.
LoadedModel load_image_model(const ImageModelArgs& args);
// The model moved to --device, in eval mode, in --precision.
void start_model(LoadedModel& model, const ImageModelArgs& args);
// start_model, then the image files to run (folders searched).
std::vector<std::string> start_image_run(LoadedModel& model, const ImageModelArgs& args);
// For a command that reads images in a build without OpenCV.
[[noreturn]] void needs_opencv(const std::string& command);

}  // namespace vit::app
