// `vit evaluate`: score a model on a dataset split: loss, top-1/5, per-class precision/recall, confusion matrix,
// the most confident mistakes; optionally with some attention heads switched off (--mask-heads).
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "train/evaluate_run.h"
#include "util/log.h"
#include "util/runtime.h"
#include "util/text.h"
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
  std::string precision;   // "" = the model file's own
  std::string mask_heads;  // "L:H,L:H"
  std::string img_size;    // --img-size: one size or a comma-separated list (default: the model's own)
};

// The text report: one size in full (per class, the most confident mistakes), several as a table.
void print_run(const EvaluateRun& run, const LoadedModel& model, const std::string& split) {
  if (run.scores.size() > 1) {
    std::printf("\n%s on %s (%lld samples)\n", model.path.c_str(), split.c_str(),
                static_cast<long long>(run.scores[0].result.count));
    std::printf("%-12s %8s %8s %8s\n", "img_size", "loss", "top-1", "top-5");
    for (const auto& s : run.scores) {
      std::printf("%-12s %8.4f %7.2f%% %7.2f%%\n", size_text(s.size[0], s.size[1]).c_str(), s.result.loss,
                  s.result.top1, s.result.top5);
    }
    return;
  }
  const auto& [size, result, report, predictions] = run.scores[0];
  (void)predictions;
  std::printf("%s on %s at %s (%lld samples)\n", model.path.c_str(), split.c_str(), size_text(size[0], size[1]).c_str(),
              static_cast<long long>(result.count));
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
}

int run_evaluate(const EvaluateOptions& options) {
  configure_threads(options.threads);
  EvaluateRequest request;
  request.split = options.split;
  request.batch_size = options.batch_size;
  request.device = resolve_device(options.device);
  request.masked_heads = options.mask_heads;
  request.predictions = !options.out.empty();
  if (!options.img_size.empty()) request.sizes = parse_img_sizes(options.img_size, /*allow_list=*/true);
  auto model = load_model_args(options.checkpoint, options.config);
  request.precision = chosen_precision(model, options.precision, request.device.type());
  for (const auto& [layer, heads] : parse_head_mask(options.mask_heads)) model.net->set_head_mask(layer, heads);
  std::shared_ptr<const ImageCodec> codec;
  ConfusionPlot plot;
#if VIT_WITH_OPENCV
  codec = image_codec();
  plot = plot_confusion;
#endif
  const auto run = evaluate_sizes(model, load_config_args(options.config), request, codec);
  if (!options.out.empty()) {
    write_evaluation(options.out, run, model.class_names, plot);
    log::info("wrote the confusion matrices (csv" + std::string(plot ? ", png" : "") +
              "), predictions.csv and report.json to " + options.out);
  }
  if (options.json) {
    std::cout << evaluation_report_text(run.report) << "\n";
  } else {
    print_run(run, model, options.split);
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
  command->add_option("--out", options->out,
                      "write confusion.csv, confusion.png, predictions.csv (every sample's) and report.json here");
  command->add_option("--batch-size", options->batch_size, "images per forward pass")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  add_device_args(command, options->device, options->threads);
  add_precision_option(command, options->precision);
  command->add_option("--mask-heads", options->mask_heads, "switch off heads, e.g. 3:1,5:0 (LAYER:HEAD)");
  add_img_size_option(command, options->img_size, /*allow_list=*/true);
  command->callback([options, &status] { status = run_evaluate(*options); });
}

}  // namespace vit::app
