// Classifying image files batch by batch, decoding overlapped with the model on a GPU.
#include "infer/predict.h"

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
  auto rows = predictions_from_logits(model.net->forward(input), topk);
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

std::vector<Prediction> predictions_from_logits(const torch::Tensor& model_logits, int64_t topk) {
  const auto logits = model_logits.to(torch::kCPU, torch::kFloat32).contiguous();  // (B, K)
  const int64_t classes = logits.size(1);
  topk = std::min(topk, classes);
  const auto [top_p, top_i] = logits.softmax(-1).topk(topk, -1);  // (B, topk)
  const auto probs = top_p.contiguous();
  const auto indices = top_i.contiguous();
  std::vector<Prediction> out(static_cast<size_t>(logits.size(0)));
  for (int64_t row = 0; row < logits.size(0); ++row) {
    Prediction& prediction = out[row];
    const float* p = probs.data_ptr<float>() + row * topk;
    const int64_t* index = indices.data_ptr<int64_t>() + row * topk;
    const float* l = logits.data_ptr<float>() + row * classes;
    prediction.top_prob.assign(p, p + topk);
    prediction.top_index.assign(index, index + topk);
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
  const int64_t topk = std::min<int64_t>(options.topk, model.model.num_classes);
  const torch::Device device = model.net->parameters().front().device();
  c10::InferenceMode inference;
  for_each_prepared_batch(paths, static_cast<size_t>(options.batch_size), model.preprocess, model.model,
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
