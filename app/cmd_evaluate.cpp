// `vit evaluate`: score a model on a dataset split: loss, top-1/5, per-class precision/recall, confusion matrix,
// the most confident mistakes; optionally with some attention heads switched off (--mask-heads).
#include <cstdio>
#include <filesystem>
#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "data/augment.h"
#include "data/loader.h"
#include "train/evaluate.h"
#include "util/fs.h"
#include "util/log.h"
#include "util/runtime.h"
#include "vit/build_config.h"
#if VIT_WITH_OPENCV
#include "image/decode.h"
#include "image/draw.h"
#endif

namespace vit::app {
namespace {

struct EvaluateOptions {
  std::string checkpoint;
  ConfigArgs config;
  std::string split = "test";
  bool json = false;
  std::string out;
  int batch_size = 256;
  std::string device = "auto";
  int threads = 0;
  std::string mask_heads;  // "L:H,L:H"
};

int run_evaluate(const EvaluateOptions& options) {
  configure_threads(options.threads);
  const auto device = resolve_device(options.device);
  auto model = load_model_args(options.checkpoint, options.config);
  // The dataset comes from --config, or from the run directory the model file sits in.
  std::optional<Config> config = load_config_args(options.config);
  if (!config) {
    const auto run_config = std::filesystem::path(model.path).parent_path() / "config.json";
    if (!file_exists(run_config.string())) {
      throw std::invalid_argument("vit evaluate needs --config FILE to know the dataset (" + run_config.string() +
                                  " does not exist)");
    }
    config = load_config(run_config.string());
  }
  config->model = model.model;
  config->data.preprocess = model.preprocess;  // score with the preprocessing the model was trained with
  ImageDecoder decoder;
#if VIT_WITH_OPENCV
  decoder = [](const std::string& path) { return decode_image(path); };
#endif
  const auto splits = open_datasets(config->data, config->train.seed, decoder);
  const auto dataset = options.split == "val" ? splits.val : splits.test;
  if (dataset->class_names().size() != model.class_names.size()) {
    throw std::invalid_argument(model.path + ": model has " + std::to_string(model.class_names.size()) +
                                " classes, the " + options.split + " split has " +
                                std::to_string(dataset->class_names().size()));
  }
  LoaderOptions loader_options;
  loader_options.batch_size = options.batch_size;
  loader_options.shuffle = false;
  loader_options.drop_last = false;
  loader_options.num_workers = config->data.num_workers;
  loader_options.skip_bad_images = config->data.on_bad_image == BadImagePolicy::skip;
  loader_options.pin_memory = device.is_cuda();
  Loader loader(dataset, make_eval_transform(config->data, config->model), loader_options);
  model.net->to(device);
  for (const auto& [layer, heads] : parse_head_mask(options.mask_heads)) model.net->set_head_mask(layer, heads);
  const auto result = evaluate(model.net, loader, model.model.num_classes, device);
  nlohmann::json report =
      evaluation_report(result, model.class_names, [&](int64_t index) { return dataset->source(index); });
  report["checkpoint"] = model.path;
  report["split"] = options.split;
  if (!options.mask_heads.empty()) report["masked_heads"] = options.mask_heads;
  if (!options.out.empty()) {
    make_dirs(options.out);
    write_file_atomic(options.out + "/confusion.csv", confusion_csv(result.confusion, model.class_names));
    write_file_atomic(options.out + "/report.json", report.dump(2) + "\n");
#if VIT_WITH_OPENCV
    plot_confusion(options.out + "/confusion.png", result.confusion, model.class_names);
#endif
    log::info("wrote confusion.csv, confusion.png and report.json to " + options.out);
  }
  if (options.json) {
    std::cout << report.dump(2) << "\n";
    return kOk;
  }
  std::printf("%s on %s (%lld samples)\n", model.path.c_str(), options.split.c_str(), static_cast<long long>(result.count));
  std::printf("loss %.4f   top-1 %.2f%%   top-5 %.2f%%\n\n", result.loss, result.top1, result.top5);
  std::printf("%-24s %10s %10s\n", "class", "precision", "recall");
  for (const auto& row : report["per_class"]) {
    std::printf("%-24s %9.2f%% %9.2f%%\n", row["class"].get<std::string>().c_str(), row["precision"].get<double>(),
                row["recall"].get<double>());
  }
  if (!result.mistakes.empty()) {
    std::printf("\nmost confident mistakes:\n");
    for (const auto& m : report["confident_mistakes"]) {
      std::printf("  %s: %s predicted as %s (%.3f)\n", m["source"].get<std::string>().c_str(),
                  m["label"].get<std::string>().c_str(), m["predicted"].get<std::string>().c_str(),
                  m["confidence"].get<double>());
    }
  }
  return kOk;
}

}  // namespace

void setup_evaluate(CLI::App& app, int& status) {
  auto options = std::make_shared<EvaluateOptions>();
  auto* command = app.add_subcommand("evaluate", "Score a model on a dataset split");
  command->add_option("--checkpoint", options->checkpoint, "model file or timm / Hugging Face snapshot folder (default: the latest run's best model)")
      ->check(CLI::ExistingPath);
  add_config_args(command, options->config);
  command->add_option("--split", options->split, "val | test")->check(CLI::IsMember({"val", "test"}))->capture_default_str();
  command->add_flag("--json", options->json, "print one JSON object");
  command->add_option("--out", options->out, "write confusion.csv, confusion.png and report.json here");
  command->add_option("--batch-size", options->batch_size, "images per forward pass")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  add_device_args(command, options->device, options->threads);
  command->add_option("--mask-heads", options->mask_heads, "switch off heads, e.g. 3:1,5:0 (LAYER:HEAD)");
  command->callback([options, &status] { status = run_evaluate(*options); });
}

}  // namespace vit::app
