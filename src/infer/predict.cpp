// Classifying image files batch by batch, decoding overlapped with the model on a GPU.
#include "infer/predict.h"

#include <future>
#include <stdexcept>

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
  const auto logits = model.net->forward(input).to(torch::kCPU, torch::kFloat32).contiguous();  // (B, K)
  const auto [top_p, top_i] = logits.softmax(-1).topk(topk, -1);                                // (B, topk)
  const auto probs = top_p.contiguous();
  const auto indices = top_i.contiguous();
  const int64_t classes = logits.size(1);
  int64_t row = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    if (!images[i].ok()) continue;
    Prediction& prediction = batch[i];
    const float* p = probs.data_ptr<float>() + row * topk;
    const int64_t* index = indices.data_ptr<int64_t>() + row * topk;
    const float* l = logits.data_ptr<float>() + row * classes;
    prediction.top_prob.assign(p, p + topk);
    prediction.top_index.assign(index, index + topk);
    prediction.logits.assign(l, l + classes);
    ++row;
  }
  return batch;
}

}  // namespace

void predict_images(LoadedModel& model, const std::vector<std::string>& paths, const PredictOptions& options,
                    const PredictionSink& on_batch) {
  if (options.topk <= 0 || options.batch_size <= 0) {
    throw std::invalid_argument("predict: topk " + std::to_string(options.topk) + " and batch size " +
                                std::to_string(options.batch_size) + " must be positive");
  }
  if (paths.empty()) return;
  const int64_t topk = std::min<int64_t>(options.topk, model.model.num_classes);
  const torch::Device device = model.net->parameters().front().device();
  const auto batch_size = static_cast<size_t>(options.batch_size);
  auto prepare = [&](size_t start) {
    const std::vector<std::string> chunk(paths.begin() + start,
                                         paths.begin() + std::min(paths.size(), start + batch_size));
    return prepare_images(chunk, model.preprocess, model.model);
  };

  c10::InferenceMode inference;
  // On a GPU the CPU decodes the next batch while the current one runs. On the CPU decoding and the model share the
  // cores: each uses all of them in turn (a decoding thread beside the model's threads would only make both wait).
  const bool overlap = device.is_cuda();
  std::future<std::vector<PreparedImage>> next;
  if (overlap) next = std::async(std::launch::async, prepare, 0);
  for (size_t start = 0; start < paths.size(); start += batch_size) {
    const std::vector<PreparedImage> images = overlap ? next.get() : prepare(start);
    if (overlap && start + batch_size < paths.size()) next = std::async(std::launch::async, prepare, start + batch_size);
    on_batch(classify(model, images, topk, device));
  }
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
