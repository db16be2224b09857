// Classifying image files batch by batch, decoding overlapped with the model on a GPU.
#include "infer/predict.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include <torch/torch.h>

#include "infer/inputs.h"

namespace vit {
namespace {

// The batch's images through the model: logits, top-k classes and probabilities for those that decoded.
std::vector<Prediction> classify(LoadedModel& model, const std::vector<PreparedImage>& images, int64_t topk,
                                 const torch::Device& device) {
  std::vector<Prediction> batch(images.size());
  for (size_t i = 0; i < images.size(); ++i) {
    batch[i].path = images[i].path;
    batch[i].error = images[i].error;
  }
  torch::Tensor input = stack_inputs(images);  // (B, C, H, W)
  if (!input.defined()) return batch;
  if (device.is_cuda()) input = input.pin_memory().to(device, /*non_blocking=*/true);
  auto rows = predictions_from_logits(eval_logits(model.net, input, model.preprocess.eval_hflip), topk);
  size_t row = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    if (!images[i].ok()) continue;
    Prediction& scored = rows[row++];
    batch[i].top_index = std::move(scored.top_index);
    batch[i].top_prob = std::move(scored.top_prob);
    batch[i].logits = std::move(scored.logits);
  }
  return batch;
}

}  // namespace

std::vector<std::pair<int64_t, float>> top_k(const float* values, int64_t n, int64_t k) {
  std::vector<std::pair<int64_t, float>> all(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) all[i] = {i, values[i]};
  k = std::clamp<int64_t>(k, 0, n);
  std::partial_sort(all.begin(), all.begin() + k, all.end(), [](const auto& a, const auto& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  });
  all.resize(static_cast<size_t>(k));
  return all;
}

std::vector<Prediction> predictions_from_logits(const torch::Tensor& model_logits, int64_t topk) {
  const auto logits = model_logits.to(torch::kCPU, torch::kFloat32).contiguous();  // (B, K)
  const auto probs = logits.softmax(-1).contiguous();
  const int64_t classes = logits.size(1);
  std::vector<Prediction> out(static_cast<size_t>(logits.size(0)));
  for (int64_t row = 0; row < logits.size(0); ++row) {
    Prediction& prediction = out[row];
    for (const auto& [index, prob] : top_k(probs.data_ptr<float>() + row * classes, classes, topk)) {
      prediction.top_index.push_back(index);
      prediction.top_prob.push_back(prob);
    }
    const float* l = logits.data_ptr<float>() + row * classes;
    prediction.logits.assign(l, l + classes);
  }
  return out;
}

void predict_images(LoadedModel& model, const std::vector<std::string>& paths, const PredictOptions& options,
                    const PredictionSink& on_batch) {
  if (options.topk <= 0 || options.batch_size <= 0) {
    throw std::invalid_argument("predict: topk " + std::to_string(options.topk) + " and batch size " +
                                std::to_string(options.batch_size) + " must be positive");
  }
  if (paths.empty()) return;
  const int64_t topk = std::min<int64_t>(options.topk, model.config().num_classes);
  const torch::Device device = model.net->parameters().front().device();
  c10::InferenceMode inference;
  for_each_prepared_batch(paths, static_cast<size_t>(options.batch_size), model.preprocess, model.config(),
                          options.limits, /*overlap=*/device.is_cuda(), [&](const std::vector<PreparedImage>& images) {
                            on_batch(classify(model, images, topk, device));
                          });
}

std::vector<Prediction> predict_images(LoadedModel& model, const std::vector<std::string>& paths,
                                       const PredictOptions& options) {
  std::vector<Prediction> all;
  predict_images(model, paths, options, [&](const std::vector<Prediction>& batch) {
    all.insert(all.end(), batch.begin(), batch.end());
  });
  return all;
}

}  // namespace vit
