// `vit evaluate`'s run: the dataset found, each input size scored, the reports and files.
#include "train/evaluate_run.h"

#include <cstdio>
#include <filesystem>

#include "data/augment.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "util/fs.h"
#include "util/log.h"
#include "util/progress.h"
#include "util/text.h"

namespace vit {

EvaluateRun evaluate_sizes(LoadedModel& model, std::optional<Config> config, const EvaluateRequest& request,
                           const std::shared_ptr<const ImageCodec>& codec) {
  if (!config) {
    const auto run_config = std::filesystem::path(model.path).parent_path() / "config.json";
    if (!file_exists(run_config.string())) {
      throw std::invalid_argument("vit evaluate needs --config FILE to know the dataset (" + run_config.string() +
                                  " does not exist)");
    }
    config = load_config(run_config.string());
  }
  config->model = model.config();
  config->data.preprocess = model.preprocess;  // score with the preprocessing the model was trained with
  const auto splits = open_datasets(config->data, config->train.seed, codec);
  const auto dataset = request.split == "val" ? splits.val : splits.test;
  if (dataset->class_names().size() != model.class_names.size()) {
    throw std::invalid_argument(model.path + ": model has " + std::to_string(model.class_names.size()) +
                                " classes, the " + request.split + " split has " +
                                std::to_string(dataset->class_names().size()));
  }
  auto sizes = request.sizes;
  const ModelConfig own = model.config();
  if (sizes.empty()) sizes.push_back({own.img_h, own.img_w});
  for (const auto& [h, w] : sizes) check_input_size(own, h, w, "--img-size " + size_option_text(h, w));
  LoaderOptions loader_options;
  loader_options.batch_size = request.batch_size;
  loader_options.shuffle = false;
  loader_options.drop_last = false;
  loader_options.num_workers = config->data.num_workers;
  loader_options.skip_bad_images = config->data.on_bad_image == BadImagePolicy::skip;
  loader_options.pin_memory = request.device.is_cuda();
  model.net->to(request.device);
  model.net->set_precision(request.precision);

  EvaluateRun run;
  const bool several = sizes.size() > 1;
  for (const auto& size : sizes) {
    const std::string size_name = size_text(size[0], size[1]);
    const std::string note =
        set_input_size(model, size[0], size[1], "--img-size " + size_option_text(size[0], size[1]));
    if (!note.empty()) log::info(model.path + ": " + note);
    config->model = model.config();  // the eval transform produces this size
    // Counted as the loader's workers finish each batch: at most `prefetch` batches ahead of the model; skipped bad
    // images are never counted.
    ProgressOptions shown;
    shown.show = dataset->size() > request.batch_size;  // one batch is over before a bar would help
    Progress progress(dataset->size(), several ? "evaluate " + size_name : std::string("evaluate"), "img", shown);
    const BatchTransform count_batch = [&progress](Batch& batch, std::mt19937_64&) {
      progress.advance(batch.images.size(0));
    };
    Loader loader(dataset, make_eval_transform(config->data, config->model), loader_options, count_batch);
    auto result = evaluate(model.net, loader, model.config().num_classes, request.device, model.preprocess.eval_hflip,
                           /*comm=*/nullptr,
                           /*keep_mistakes=*/20, request.predictions);
    progress.finish();
    nlohmann::json report =
        evaluation_report(result, model.class_names, [&](int64_t index) { return dataset->source(index); });
    report["checkpoint"] = model.path;
    report["split"] = request.split;
    report["img_size"] = {size[0], size[1]};
    report["precision"] = name_of(request.precision);
    report["eval_hflip"] = model.preprocess.eval_hflip;
    if (!request.masked_heads.empty()) report["masked_heads"] = request.masked_heads;
    if (several) {
      char line[128];
      std::snprintf(line, sizeof line, "%s at %s: top-1 %.2f%%", request.split.c_str(), size_name.c_str(),
                    result.top1);
      log::info(line);
    }
    std::string predictions;
    if (request.predictions) {
      predictions = predictions_csv(std::move(result.predictions), model.class_names,
                                    [&](int64_t index) { return dataset->source(index); });
    }
    run.scores.push_back({size, std::move(result), std::move(report), std::move(predictions)});
  }
  if (several) {
    nlohmann::json all = nlohmann::json::array();
    for (const auto& s : run.scores) all.push_back(s.report);
    run.report = {{"checkpoint", model.path}, {"split", request.split}, {"sizes", all}};
  } else {
    run.report = run.scores[0].report;
  }
  return run;
}

std::string evaluation_report_text(const nlohmann::json& report) {
  return report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

void write_evaluation(const std::string& out, const EvaluateRun& run, const std::vector<std::string>& class_names,
                      const ConfusionPlot& plot) {
  make_dirs(out);
  const bool several = run.scores.size() > 1;
  for (const auto& s : run.scores) {
    // One size: confusion.csv and confusion.png; several: each with its size in the name (confusion_35x35.csv).
    const std::string stem = out + "/confusion" + (several ? "_" + size_text(s.size[0], s.size[1]) : "");
    write_file_atomic(stem + ".csv", confusion_csv(s.result.confusion, class_names));
    if (!s.predictions_csv.empty()) {
      write_file_atomic(out + "/predictions" + (several ? "_" + size_text(s.size[0], s.size[1]) : "") + ".csv",
                        s.predictions_csv);
    }
    if (plot) plot(stem + ".png", s.result.confusion, class_names);
  }
  write_file_atomic(out + "/report.json", evaluation_report_text(run.report) + "\n");
}

}  // namespace vit
