// Scoring a model on a dataset: loss, top-1/top-5, confusion matrix, the most confident mistakes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <torch/torch.h>

#include "data/loader.h"
#include "model/vit.h"
#include "train/distributed.h"

namespace vit {

struct Mistake {
  int64_t index = 0;      // dataset index
  int64_t label = 0;      // true class
  int64_t predicted = 0;  // predicted class
  double confidence = 0;  // probability of the predicted class
};

using SamplePrediction = Mistake;  // the same fields, for every sample

struct EvalResult {
  double loss = 0.0;   // mean cross-entropy (no smoothing)
  double top1 = 0.0;   // percent
  double top5 = 0.0;   // percent
  int64_t count = 0;   // samples scored (over all ranks)
  torch::Tensor confusion;       // (K, K) int64: rows = true class, columns = predicted
  std::vector<Mistake> mistakes; // most confident wrong predictions, highest first (this rank's)
  // With keep_predictions: every sample's, in the loader's order (this rank's).
  std::vector<SamplePrediction> predictions;
};

// Runs the whole epoch-0 pass of `loader` through `net` in eval mode, without autograd, scoring eval_logits() (with
// `hflip`: each image's and its mirror's mean). Metrics are summed over ranks through `comm` (may be null for one
// process).
EvalResult evaluate(VisionTransformer& net, Loader& loader, int64_t num_classes, const torch::Device& device,
                    bool hflip, Communicator* comm = nullptr, int64_t keep_mistakes = 20,
                    bool keep_predictions = false);

// Per-class precision and recall (percent) from a confusion matrix.
std::vector<std::pair<double, double>> precision_recall(const torch::Tensor& confusion);

// The report `vit evaluate --json` prints and report.json holds: samples, loss, top1, top5, per_class (class,
// precision, recall) and confident_mistakes (source, label, predicted, confidence); `source_of(index)` names a
// dataset sample (its file, or its index in an archive).
nlohmann::json evaluation_report(const EvalResult& result, const std::vector<std::string>& class_names,
                                 const std::function<std::string(int64_t)>& source_of);

// Every sample's prediction as CSV: "index,source,label,predicted,confidence", one row per sample in dataset index
// order, class names and sources quoted where they need it.
std::string predictions_csv(std::vector<SamplePrediction> predictions, const std::vector<std::string>& class_names,
                            const std::function<std::string(int64_t)>& source_of);

// The confusion matrix as CSV: a header "true\predicted,<class>,...", then one row of counts per true class.
std::string confusion_csv(const torch::Tensor& confusion, const std::vector<std::string>& class_names);

}  // namespace vit
