// `vit predict`: classify image files and folders with a trained model (src/infer/predict.h), as text or JSON.
#include <algorithm>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "util/fs.h"
#include "util/log.h"
#include "util/progress.h"
#include "util/runtime.h"
#include "util/text.h"
#include "vit/build_config.h"
#if VIT_WITH_OPENCV
#include "infer/predict.h"
#endif

namespace vit::app {
namespace {

struct PredictOptions {
  ImageModelArgs image_model;
  int topk = 5;
  bool json = false;
  int batch_size = 16;
};

#if VIT_WITH_OPENCV
int run_predict(const PredictOptions& options) {
  auto model = load_image_model(options.image_model);
  const auto files = start_image_run(model, options.image_model);

  nlohmann::json results = nlohmann::json::array();
  int failures = 0;
  auto print_error = [&](const Prediction& image) {
    ++failures;
    log::error(image.error);
    // Paths and messages are escaped: a file name may hold control bytes, or bytes that are not UTF-8 (JSON needs it).
    if (options.json) {
      results.push_back({{"image", printable(image.path)}, {"error", printable(image.error)}});
    } else {
      std::printf("%s: error: %s\n", printable(image.path).c_str(), printable(image.error).c_str());
    }
  };
  auto print_prediction = [&](const Prediction& image) {
    nlohmann::json top = nlohmann::json::array();
    std::string line = printable(image.path) + ":";
    for (size_t k = 0; k < image.top_index.size(); ++k) {
      const int64_t index = image.top_index[k];
      const double p = image.top_prob[k];
      top.push_back({{"index", index}, {"label", model.class_names[index]}, {"prob", p}});
      char cell[256];
      std::snprintf(cell, sizeof cell, "%s %s (%.4f)", k ? "," : "", model.class_names[index].c_str(), p);
      line += cell;
    }
    if (options.json) {
      results.push_back({{"image", printable(image.path)}, {"topk", top}, {"logits", image.logits}});
    } else {
      std::printf("%s\n", line.c_str());
    }
  };
  ProgressOptions shown;
  shown.show = files.size() > static_cast<size_t>(options.batch_size);  // one batch is over before a bar would help
  Progress progress(static_cast<int64_t>(files.size()), "predict", "img", shown);
  // Printed batch by batch as they come: a batch's errors first, then its classified images. The bar makes way for
  // them: stdout may share its terminal.
  const vit::PredictOptions batching{options.topk, options.batch_size, options.image_model.limits};
  predict_images(model, files, batching, [&](const std::vector<Prediction>& batch) {
    const bool any_error = std::any_of(batch.begin(), batch.end(), [](const Prediction& p) { return !p.ok(); });
    if (!options.json || any_error) progress.clear();
    for (const auto& image : batch) {
      if (!image.ok()) print_error(image);
    }
    for (const auto& image : batch) {
      if (image.ok()) print_prediction(image);
    }
    std::fflush(stdout);  // the lines before the bar that follows them on stderr
    progress.advance(static_cast<int64_t>(batch.size()));
  });
  progress.finish();
  // Class names come from the model file: replaced where not UTF-8 rather than failing the whole report.
  if (options.json) std::cout << results.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  if (failures > 0) {
    log::error(std::to_string(failures) + " of " + std::to_string(files.size()) + " images could not be classified");
  }
  return inputs_status(failures, files.size());
}
#else
int run_predict(const PredictOptions&) { needs_opencv("predict"); }
#endif

}  // namespace

void setup_predict(CLI::App& app, int& status) {
  auto options = std::make_shared<PredictOptions>();
  auto* command = app.add_subcommand("predict", "Classify images (files or folders, searched recursively)");
  add_image_model_args(command, options->image_model);
  command->add_option("--topk", options->topk, "classes to show per image")->check(CLI::PositiveNumber)->capture_default_str();
  command->add_flag("--json", options->json, "print a JSON array, one object per image");
  command->add_option("--batch-size", options->batch_size, "images per forward pass")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->callback([options, &status] { status = run_predict(*options); });
}

}  // namespace vit::app
