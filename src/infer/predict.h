// Classifying image files: batches decoded in parallel (infer/inputs.h), the model's top-k and logits per image, an
// error per image that could not be decoded. On a GPU the next batch decodes while the current one runs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "data/image.h"
#include "io/model_file.h"

namespace vit {

struct PredictOptions {
  int64_t topk = 5;         // classes per image, capped at the model's num_classes
  int64_t batch_size = 16;  // images per forward pass
  ImageLimits limits;       // per input file: larger files and images are refused undecoded
};

struct Prediction {
  std::string path;
  std::string error;               // why the image was not classified (names the path); "" when it was
  std::vector<int64_t> top_index;  // the top-k classes, most probable first
  std::vector<float> top_prob;     // their softmax probabilities
  std::vector<float> logits;       // the model's float32 output row (num_classes values)
  bool ok() const { return error.empty(); }
};

// Called once per batch, in order; a batch's predictions are in input order.
using PredictionSink = std::function<void(const std::vector<Prediction>& batch)>;

// The k largest of values[0..n) as (index, value), largest first, the lower index first among equals (k capped at
// n). Plain C++: vit serve's connection threads call it without LibTorch.
std::vector<std::pair<int64_t, float>> top_k(const float* values, int64_t n, int64_t k);

// Each row of `logits` (B, K; any device and float type) as predict reports it: softmax probabilities of the top-k
// classes (topk capped at K), most probable first, and the float32 row itself; paths and errors left empty.
std::vector<Prediction> predictions_from_logits(const torch::Tensor& logits, int64_t topk);

// Classifies `paths` (image files, e.g. from expand_image_inputs) with `model`, which must be on its device and in
// eval mode; runs in inference mode. Throws std::invalid_argument for a non-positive topk or batch_size; an image
// that fails is reported in its Prediction, never thrown.
void predict_images(LoadedModel& model, const std::vector<std::string>& paths, const PredictOptions& options,
                    const PredictionSink& on_batch);
// The same, all predictions at once, in input order.
std::vector<Prediction> predict_images(LoadedModel& model, const std::vector<std::string>& paths,
                                       const PredictOptions& options);

}  // namespace vit
