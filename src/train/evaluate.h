// Scoring a model on a dataset: loss, top-1/top-5, confusion matrix, the most confident mistakes.
#pragma once

#include <cstdint>
#include <vector>

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

struct EvalResult {
  double loss = 0.0;   // mean cross-entropy (no smoothing)
  double top1 = 0.0;   // percent
  double top5 = 0.0;   // percent
  int64_t count = 0;   // samples scored (over all ranks)
  torch::Tensor confusion;       // (K, K) int64: rows = true class, columns = predicted
  std::vector<Mistake> mistakes; // most confident wrong predictions, highest first (this rank's)
};

// Runs the whole epoch-0 pass of `loader` through `net` in eval mode, without autograd. Metrics are summed over
// ranks through `comm` (may be null for one process).
EvalResult evaluate(VisionTransformer& net, Loader& loader, int64_t num_classes, const torch::Device& device,
                    Communicator* comm = nullptr, int64_t keep_mistakes = 20);

// Per-class precision and recall (percent) from a confusion matrix.
std::vector<std::pair<double, double>> precision_recall(const torch::Tensor& confusion);

}  // namespace vit
