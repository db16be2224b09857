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
#include "util/progress.h"
#include "util/runtime.h"
#include "vit/build_config.h"
#if VIT_WITH_OPENCV
#include "image/decode.h"
#include "image/draw.h"
#endif

namespace vit::app {
namespace {

// Paths and class names need not be UTF-8: bad bytes become U+FFFD rather than failing the report.
std::string report_text(const nlohmann::json& report) {
  return report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

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
  std::string img_size;    // --img-size: one size or a comma-separated list (default: the model's own)
};

std::string size_name(const std::array<int64_t, 2>& size) {
  return std::to_string(size[0]) + "x" + std::to_string(size[1]);
}

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
  std::shared_ptr<const ImageCodec> codec;
#if VIT_WITH_OPENCV
  codec = image_codec();
#endif
  const auto splits = open_datasets(config->data, config->train.seed, codec);
  const auto dataset = options.split == "val" ? splits.val : splits.test;
  if (dataset->class_names().size() != model.class_names.size()) {
    throw std::invalid_argument(model.path + ": model has " + std::to_string(model.class_names.size()) +
                                " classes, the " + options.split + " split has " +
                                std::to_string(dataset->class_names().size()));
  }
  // Every size is checked before the first is scored.
  const std::vector<std::array<int64_t, 2>> sizes =
      options.img_size.empty() ? std::vector<std::array<int64_t, 2>>{{model.model.img_h, model.model.img_w}}
                               : parse_img_sizes(options.img_size, /*allow_list=*/true);
  for (const auto& size : sizes) check_input_size(model.model, size[0], size[1], "--img-size " + img_size_text(size));
  LoaderOptions loader_options;
  loader_options.batch_size = options.batch_size;
  loader_options.shuffle = false;
  loader_options.drop_last = false;
  loader_options.num_workers = config->data.num_workers;
  loader_options.skip_bad_images = config->data.on_bad_image == BadImagePolicy::skip;
  loader_options.pin_memory = device.is_cuda();
  model.net->to(device);
  for (const auto& [layer, heads] : parse_head_mask(options.mask_heads)) model.net->set_head_mask(layer, heads);

  struct Scored {
    std::array<int64_t, 2> size;
    EvalResult result;
    nlohmann::json report;
  };
  std::vector<Scored> scored;
  const bool several_sizes = sizes.size() > 1;
  for (const auto& size : sizes) {
    run_at_size(model, size);
    config->model = model.model;  // the eval transform produces this size
    // Counted as the loader's workers finish each batch (train/evaluate.h takes no callback): at most `prefetch`
    // batches ahead of the model; skipped bad images are never counted.
    ProgressOptions shown;
    shown.show = dataset->size() > options.batch_size;  // one batch is over before a bar would help
    const std::string label = several_sizes ? std::string("evaluate ") + size_name(size) : std::string("evaluate");
    Progress progress(dataset->size(), label, "img", shown);
    const BatchTransform count_batch = [&progress](Batch& batch, std::mt19937_64&) {
      progress.advance(batch.images.size(0));
    };
    Loader loader(dataset, make_eval_transform(config->data, config->model), loader_options, count_batch);
    auto result = evaluate(model.net, loader, model.model.num_classes, device);
    progress.finish();
    nlohmann::json report =
        evaluation_report(result, model.class_names, [&](int64_t index) { return dataset->source(index); });
    report["checkpoint"] = model.path;
    report["split"] = options.split;
    report["img_size"] = {size[0], size[1]};
    if (!options.mask_heads.empty()) report["masked_heads"] = options.mask_heads;
    if (sizes.size() > 1) {
      char line[128];
      std::snprintf(line, sizeof line, "%s at %s: top-1 %.2f%%", options.split.c_str(), size_name(size).c_str(),
                    result.top1);
      log::info(line);
    }
    scored.push_back({size, std::move(result), std::move(report)});
  }
  const bool several = scored.size() > 1;
  nlohmann::json all = nlohmann::json::array();
  for (const auto& s : scored) all.push_back(s.report);
  const nlohmann::json combined = {{"checkpoint", model.path}, {"split", options.split}, {"sizes", all}};

  if (!options.out.empty()) {
    make_dirs(options.out);
    for (const auto& s : scored) {
      // One size: confusion.csv and confusion.png; several: each with its size in the name (confusion_35x35.csv).
      const std::string suffix = several ? "_" + size_name(s.size) : "";
      write_file_atomic(options.out + "/confusion" + suffix + ".csv", confusion_csv(s.result.confusion, model.class_names));
#if VIT_WITH_OPENCV
      plot_confusion(options.out + "/confusion" + suffix + ".png", s.result.confusion, model.class_names);
#endif
    }
    write_file_atomic(options.out + "/report.json", report_text(several ? combined : scored[0].report) + "\n");
    log::info("wrote the confusion matrices (csv, png) and report.json to " + options.out);
  }
  if (options.json) {
    std::cout << report_text(several ? combined : scored[0].report) << "\n";
    return kOk;
  }
  if (several) {
    std::printf("\n%s on %s (%lld samples)\n", model.path.c_str(), options.split.c_str(),
                static_cast<long long>(scored[0].result.count));
    std::printf("%-12s %8s %8s %8s\n", "img_size", "loss", "top-1", "top-5");
    for (const auto& s : scored) {
      std::printf("%-12s %8.4f %7.2f%% %7.2f%%\n", size_name(s.size).c_str(), s.result.loss, s.result.top1,
                  s.result.top5);
    }
    return kOk;
  }
  const auto& result = scored[0].result;
  const auto& report = scored[0].report;
  std::printf("%s on %s at %s (%lld samples)\n", model.path.c_str(), options.split.c_str(),
              size_name(scored[0].size).c_str(), static_cast<long long>(result.count));
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
  command->add_option("--checkpoint", options->checkpoint, kCheckpointHelp)
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
  add_img_size_option(command, options->img_size, /*allow_list=*/true);
  command->callback([options, &status] { status = run_evaluate(*options); });
}

}  // namespace vit::app
