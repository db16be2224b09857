// `vit evaluate`'s run: a model scored on one split of its dataset at one or more input sizes, with the reports and
// the files (confusion matrices, report.json) it leaves.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "data/image.h"
#include "io/model_file.h"
#include "train/evaluate.h"

namespace vit {

struct EvaluateRequest {
  std::string split = "test";                  // val | test
  std::vector<std::array<int64_t, 2>> sizes;   // input sizes to score at; empty: the model's own
  int64_t batch_size = 256;
  torch::Device device = torch::kCPU;
  Precision precision = Precision::fp32;  // model/precision.h
  bool predictions = false;  // keep every sample's prediction (SizeScore::predictions_csv)
  std::string masked_heads;  // --mask-heads as given, for the report (the mask is set on the model by the caller)
};

struct SizeScore {
  std::array<int64_t, 2> size{};
  EvalResult result;
  nlohmann::json report;  // evaluation_report() with checkpoint, split, img_size (and masked_heads)
  std::string predictions_csv;  // with EvaluateRequest::predictions: predictions_csv() of every sample
};

struct EvaluateRun {
  std::vector<SizeScore> scores;  // one per size, in the order asked
  nlohmann::json report;          // one size: its report; several: {checkpoint, split, sizes: [each report]}
};

// Scores `model` on the split of `config`'s dataset (none: the config.json of the run folder the model file sits in),
// with the preprocessing the model was trained with, at each size (every size checked before the first is scored).
// A progress bar per size; with several sizes a log line each. Throws std::invalid_argument when no config names the
// dataset or the split's classes differ from the model's.
EvaluateRun evaluate_sizes(LoadedModel& model, std::optional<Config> config, const EvaluateRequest& request,
                           const std::shared_ptr<const ImageCodec>& codec);

// Draws a confusion matrix as an image (image/draw.h's plot_confusion where the build has OpenCV).
using ConfusionPlot = std::function<void(const std::string& path, const torch::Tensor& confusion,
                                         const std::vector<std::string>& class_names)>;

// Writes `out`/confusion.csv (and .png through `plot`, when given) and, when kept, predictions.csv per size, named
// confusion_HxW.* and predictions_HxW.csv when there are several, and `out`/report.json (run.report). Paths and class names need not be UTF-8: bad bytes become U+FFFD.
void write_evaluation(const std::string& out, const EvaluateRun& run, const std::vector<std::string>& class_names,
                      const ConfusionPlot& plot);

// The report as text (indented JSON; bytes that are not UTF-8 replaced rather than failing).
std::string evaluation_report_text(const nlohmann::json& report);

}  // namespace vit
