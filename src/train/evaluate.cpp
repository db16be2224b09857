// Evaluation pass shared by `vit train` (every eval_interval epochs) and `vit evaluate`.
#include "train/evaluate.h"

#include <algorithm>
#include <cstdio>

namespace vit {

EvalResult evaluate(VisionTransformer& net, Loader& loader, int64_t num_classes, const torch::Device& device,
                    bool hflip, Communicator* comm, int64_t keep_mistakes, bool keep_predictions) {
  const bool was_training = net->is_training();
  net->eval();
  torch::NoGradGuard no_grad;
  double loss_sum = 0.0;
  int64_t correct1 = 0, correct5 = 0, count = 0;
  auto confusion = torch::zeros({num_classes, num_classes}, torch::kInt64);
  std::vector<Mistake> mistakes;
  std::vector<SamplePrediction> predictions;
  const int64_t k5 = std::min<int64_t>(5, num_classes);
  loader.start_epoch(0);
  while (auto batch = loader.next()) {
    auto images = batch->images.to(device, /*non_blocking=*/true);
    auto labels = batch->labels.to(device, /*non_blocking=*/true);
    auto logits = eval_logits(net, images, hflip).to(torch::kFloat32);  // (B, K)
    loss_sum += torch::nn::functional::cross_entropy(
                    logits, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                    .item<double>();
    auto top = std::get<1>(logits.topk(k5, -1));            // (B, k5)
    auto hits = top.eq(labels.unsqueeze(1));                 // (B, k5)
    correct1 += hits.select(1, 0).sum().item<int64_t>();
    correct5 += hits.any(1).sum().item<int64_t>();
    auto probs = logits.softmax(-1).cpu();
    auto predicted = top.select(1, 0).cpu();
    auto labels_cpu = labels.cpu();
    const int64_t B = labels_cpu.size(0);
    count += B;
    confusion.view(-1).index_add_(0, labels_cpu * num_classes + predicted, torch::ones({B}, torch::kInt64));
    auto p_acc = probs.accessor<float, 2>();
    auto pred_acc = predicted.accessor<int64_t, 1>();
    auto label_acc = labels_cpu.accessor<int64_t, 1>();
    for (int64_t i = 0; i < B; ++i) {
      if (keep_predictions) {
        predictions.push_back({batch->indices[i], label_acc[i], pred_acc[i], p_acc[i][pred_acc[i]]});
      }
      if (pred_acc[i] != label_acc[i]) {
        mistakes.push_back({batch->indices[i], label_acc[i], pred_acc[i], p_acc[i][pred_acc[i]]});
      }
    }
    // Keep only the most confident mistakes so far.
    if (static_cast<int64_t>(mistakes.size()) > 4 * keep_mistakes) {
      std::partial_sort(mistakes.begin(), mistakes.begin() + keep_mistakes, mistakes.end(),
                        [](const Mistake& a, const Mistake& b) { return a.confidence > b.confidence; });
      mistakes.resize(keep_mistakes);
    }
  }
  if (comm != nullptr && comm->world_size() > 1) {
    auto sums = torch::tensor({loss_sum, static_cast<double>(correct1), static_cast<double>(correct5),
                               static_cast<double>(count)},
                              torch::kFloat64);
    std::vector<torch::Tensor> tensors{sums, confusion};
    comm->all_reduce_sum(tensors);
    loss_sum = sums[0].item<double>();
    correct1 = static_cast<int64_t>(sums[1].item<double>());
    correct5 = static_cast<int64_t>(sums[2].item<double>());
    count = static_cast<int64_t>(sums[3].item<double>());
  }
  std::sort(mistakes.begin(), mistakes.end(),
            [](const Mistake& a, const Mistake& b) { return a.confidence > b.confidence; });
  if (static_cast<int64_t>(mistakes.size()) > keep_mistakes) mistakes.resize(keep_mistakes);
  if (was_training) net->train();
  EvalResult result;
  result.count = count;
  result.loss = count ? loss_sum / count : 0.0;
  result.top1 = count ? 100.0 * correct1 / count : 0.0;
  result.top5 = count ? 100.0 * correct5 / count : 0.0;
  result.confusion = confusion;
  result.mistakes = std::move(mistakes);
  result.predictions = std::move(predictions);
  return result;
}

namespace {
// A CSV field: as it is, or in double quotes (inner quotes doubled) when it holds a comma, quote or line break.
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  quoted += '"';
  return quoted;
}
}  // namespace

std::string predictions_csv(std::vector<SamplePrediction> predictions, const std::vector<std::string>& class_names,
                            const std::function<std::string(int64_t)>& source_of) {
  std::sort(predictions.begin(), predictions.end(),
            [](const SamplePrediction& a, const SamplePrediction& b) { return a.index < b.index; });
  auto name = [&](int64_t c) {
    return c >= 0 && c < static_cast<int64_t>(class_names.size()) ? class_names[c] : std::to_string(c);
  };
  std::string csv = "index,source,label,predicted,confidence\n";
  char confidence[32];
  for (const auto& p : predictions) {
    std::snprintf(confidence, sizeof confidence, "%.6f", p.confidence);
    csv += std::to_string(p.index);
    csv += ',';
    csv += csv_field(source_of(p.index));
    csv += ',';
    csv += csv_field(name(p.label));
    csv += ',';
    csv += csv_field(name(p.predicted));
    csv += ',';
    csv += confidence;
    csv += '\n';
  }
  return csv;
}

std::vector<std::pair<double, double>> precision_recall(const torch::Tensor& confusion) {
  const int64_t K = confusion.size(0);
  auto c = confusion.to(torch::kFloat64);
  auto true_positive = c.diagonal();
  auto predicted = c.sum(0), actual = c.sum(1);
  std::vector<std::pair<double, double>> out;
  for (int64_t k = 0; k < K; ++k) {
    const double tp = true_positive[k].item<double>();
    const double p = predicted[k].item<double>(), a = actual[k].item<double>();
    out.emplace_back(p > 0 ? 100.0 * tp / p : 0.0, a > 0 ? 100.0 * tp / a : 0.0);
  }
  return out;
}

nlohmann::json evaluation_report(const EvalResult& result, const std::vector<std::string>& class_names,
                                 const std::function<std::string(int64_t)>& source_of) {
  nlohmann::json report{{"samples", result.count}, {"loss", result.loss}, {"top1", result.top1}, {"top5", result.top5}};
  const auto per_class = precision_recall(result.confusion);
  nlohmann::json classes = nlohmann::json::array();
  for (size_t k = 0; k < per_class.size(); ++k) {
    classes.push_back({{"class", class_names[k]}, {"precision", per_class[k].first}, {"recall", per_class[k].second}});
  }
  report["per_class"] = classes;
  nlohmann::json mistakes = nlohmann::json::array();
  for (const auto& m : result.mistakes) {
    mistakes.push_back({{"source", source_of(m.index)},
                        {"label", class_names[m.label]},
                        {"predicted", class_names[m.predicted]},
                        {"confidence", m.confidence}});
  }
  report["confident_mistakes"] = mistakes;
  return report;
}

std::string confusion_csv(const torch::Tensor& confusion, const std::vector<std::string>& class_names) {
  std::string csv = "true\\predicted";
  for (const auto& name : class_names) csv += "," + name;
  csv += "\n";
  const auto counts = confusion.to(torch::kInt64).contiguous();
  const auto acc = counts.accessor<int64_t, 2>();
  for (int64_t r = 0; r < counts.size(0); ++r) {
    csv += class_names[r];
    for (int64_t c = 0; c < counts.size(1); ++c) {
      csv += ',';  // two appends: GCC 12 in C++20 mode warns falsely on "," + std::string&&
      csv += std::to_string(acc[r][c]);
    }
    csv += "\n";
  }
  return csv;
}

}  // namespace vit
