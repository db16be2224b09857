// `vit train`: train a ViT from a JSON config; Ctrl-C saves the state so that --resume continues exactly.
#include <csignal>
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "common.h"
#include "train/distributed.h"
#include "train/trainer.h"
#include "util/log.h"
#include "vit/build_config.h"
#if VIT_WITH_OPENCV
#include "image/decode.h"
#include "image/draw.h"
#include "image/randaugment.h"
#endif

namespace vit::app {
namespace {

struct TrainOptions {
  ConfigArgs config;
  std::string out;
  std::string resume;
  std::string init_from;
};

extern "C" void on_stop_signal(int) { request_stop(); }

int run_train(const TrainOptions& options) {
  TrainRequest request;
  if (options.resume.empty()) {
    const auto config = load_config_args(options.config);
    if (!config) throw std::invalid_argument("vit train needs --config FILE (or --resume RUN_DIR)");
    request.config = *config;
    request.config_name = std::filesystem::path(options.config.config).stem().string();
  } else if (!options.config.config.empty() || !options.config.overrides.empty()) {
    throw std::invalid_argument("--resume continues a run with its own config.json: drop --config/--set");
  }
  request.out_dir = options.out;
  request.resume_dir = options.resume;
  request.init_from = options.init_from;
  TrainHooks hooks;
#if VIT_WITH_OPENCV
  hooks.codec = image_codec();
  hooks.make_randaugment = [](int64_t ops, double magnitude) { return make_randaugment(ops, magnitude); };
  hooks.plot_curves = [](const std::string& path, const std::vector<CurvePanel>& panels) { plot_curves(path, panels); };
#endif
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  TrainResult result;
  try {
    result = train(request, hooks);
  } catch (const TrainingInterrupted& e) {
    log::warn(e.what());
    return kInterrupted;
  }
  if (dist_env_from_environment().rank != 0) return kOk;  // rank 0 reports for the whole job
  std::printf("run directory: %s\n", result.run_dir.c_str());
  std::printf("best top-1:    %.2f%%  (final %.2f%%; on the validation split)\n", result.best_top1, result.final_top1);
  std::printf("wall time:     %.1f s for %lld steps\n", result.seconds, static_cast<long long>(result.steps));
  if (result.seconds_to_target >= 0) {
    std::printf("time to %s%%:   %.1f s\n", csv_number(result.target_top1).c_str(), result.seconds_to_target);
  }
  std::printf("final model:   %s/final.safetensors (%s weights at the last step)\n", result.run_dir.c_str(),
              name_of(result.final_weights));
  std::printf("best model:    %s/best.safetensors (picked on the validation split)\n", result.run_dir.c_str());
  return kOk;
}

}  // namespace

void setup_train(CLI::App& app, int& status) {
  auto options = std::make_shared<TrainOptions>();
  auto* command = app.add_subcommand("train", "Train a ViT from a JSON config (writes a run directory)");
  add_config_args(command, options->config);
  command->add_option("--out", options->out, "run directory (default: <train.output_root>/<config>-<time>)");
  command->add_option("--resume", options->resume, "continue this run directory exactly")->check(CLI::ExistingDirectory);
  command->add_option("--init-from", options->init_from, "fine-tune from a model file (ours or timm's) or a timm / Hugging Face snapshot folder")
      ->check(CLI::ExistingPath);
  command->callback([options, &status] { status = run_train(*options); });
}

}  // namespace vit::app
