// `vit predict`: classify image files and folders with a trained model; images decode in parallel, and overlap the
// model on a GPU.
#include <ATen/Parallel.h>

#include <cstdio>
#include <future>
#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "util/fs.h"
#include "util/log.h"
#include "util/runtime.h"
#include "vit/build_config.h"
#if VIT_WITH_OPENCV
#include "data/image.h"
#include "image/decode.h"
#endif

namespace vit::app {
namespace {

struct PredictOptions {
  std::string checkpoint;
  ConfigArgs config;
  int topk = 5;
  bool json = false;
  int batch_size = 16;
  std::string device = "auto";
  int threads = 0;
  std::vector<std::string> inputs;
};

#if VIT_WITH_OPENCV
// One decoded-and-preprocessed batch: rows for the images that decoded, errors for those that did not.
struct PreparedBatch {
  std::vector<std::string> paths;   // images in `images` order
  torch::Tensor images;             // (B, C, H, W)
  std::vector<std::pair<std::string, std::string>> errors;  // (path, message)
};

// Decodes and preprocesses a batch, one image per task across libtorch's intra-op threads (each image's resize then
// runs on its own thread, as a nested parallel region runs inline).
PreparedBatch prepare(const std::vector<std::string>& paths, const LoadedModel& model) {
  const auto count = static_cast<int64_t>(paths.size());
  std::vector<torch::Tensor> decoded(paths.size());
  std::vector<std::string> failed(paths.size());
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      try {
        decoded[i] = preprocess(decode_image(paths[i]), model.preprocess, model.model.img_h, model.model.img_w,
                                model.model.in_chans);
      } catch (const std::exception& e) {
        failed[i] = e.what();
        if (failed[i].empty()) failed[i] = "could not be decoded";
      }
    }
  });
  PreparedBatch batch;
  std::vector<torch::Tensor> rows;
  for (size_t i = 0; i < paths.size(); ++i) {
    if (decoded[i].defined()) {
      rows.push_back(decoded[i]);
      batch.paths.push_back(paths[i]);
    } else {
      batch.errors.emplace_back(paths[i], failed[i]);
    }
  }
  if (!rows.empty()) batch.images = torch::stack(rows);
  return batch;
}

int run_predict(const PredictOptions& options) {
  configure_threads(options.threads);
  const auto device = resolve_device(options.device);
  auto model = load_model_args(options.checkpoint, options.config);
  model.net->to(device);
  model.net->eval();
  const auto files = expand_image_inputs(options.inputs);
  if (files.empty()) throw std::invalid_argument("no image files found in the given inputs");
  const int64_t topk = std::min<int64_t>(options.topk, model.model.num_classes);

  std::vector<std::vector<std::string>> chunks;
  for (size_t i = 0; i < files.size(); i += options.batch_size) {
    chunks.emplace_back(files.begin() + i, files.begin() + std::min(files.size(), i + options.batch_size));
  }
  nlohmann::json results = nlohmann::json::array();
  int failures = 0;
  auto report_error = [&](const std::string& path, const std::string& message) {
    ++failures;
    log::error(message);
    if (options.json) {
      results.push_back({{"image", path}, {"error", message}});
    } else {
      std::printf("%s: error: %s\n", path.c_str(), message.c_str());
    }
  };

  c10::InferenceMode inference;
  // On a GPU the CPU decodes the next batch while the current one runs. On the CPU decoding and the model share the
  // cores: each uses all of them in turn (a decoding thread beside the model's threads would only make both wait).
  const bool overlap = device.is_cuda();
  std::future<PreparedBatch> next;
  if (overlap) next = std::async(std::launch::async, prepare, chunks[0], std::cref(model));
  for (size_t c = 0; c < chunks.size(); ++c) {
    PreparedBatch batch = overlap ? next.get() : prepare(chunks[c], model);
    if (overlap && c + 1 < chunks.size()) {
      next = std::async(std::launch::async, prepare, chunks[c + 1], std::cref(model));
    }
    for (const auto& [path, message] : batch.errors) report_error(path, message);
    if (batch.paths.empty()) continue;
    torch::Tensor input = batch.images;
    if (device.is_cuda()) input = input.pin_memory().to(device, /*non_blocking=*/true);
    auto logits = model.net->forward(input).to(torch::kCPU, torch::kFloat32);  // (B, K)
    auto probs = logits.softmax(-1);
    auto [top_p, top_i] = probs.topk(topk, -1);
    for (size_t r = 0; r < batch.paths.size(); ++r) {
      const auto row = static_cast<int64_t>(r);
      nlohmann::json top = nlohmann::json::array();
      std::string line = batch.paths[r] + ":";
      for (int64_t k = 0; k < topk; ++k) {
        const int64_t index = top_i[row][k].item<int64_t>();
        const double p = top_p[row][k].item<float>();
        top.push_back({{"index", index}, {"label", model.class_names[index]}, {"prob", p}});
        char cell[256];
        std::snprintf(cell, sizeof cell, "%s %s (%.4f)", k ? "," : "", model.class_names[index].c_str(), p);
        line += cell;
      }
      if (!options.json) {
        std::printf("%s\n", line.c_str());
        continue;
      }
      auto row_logits = logits[row].contiguous();
      std::vector<float> all(row_logits.data_ptr<float>(), row_logits.data_ptr<float>() + row_logits.numel());
      results.push_back({{"image", batch.paths[r]}, {"topk", top}, {"logits", all}});
    }
  }
  if (options.json) std::cout << results.dump(2) << "\n";
  if (failures > 0) {
    log::error(std::to_string(failures) + " of " + std::to_string(files.size()) + " images could not be classified");
    return kPartial;
  }
  return kOk;
}
#else
int run_predict(const PredictOptions&) {
  throw std::runtime_error("this vit was built without OpenCV: predict is unavailable");
}
#endif

}  // namespace

void setup_predict(CLI::App& app, int& status) {
  auto options = std::make_shared<PredictOptions>();
  auto* command = app.add_subcommand("predict", "Classify images (files or folders, searched recursively)");
  command->add_option("--checkpoint", options->checkpoint, "model file (default: the latest run's best model)")
      ->check(CLI::ExistingFile);
  add_config_args(command, options->config);
  command->add_option("--topk", options->topk, "classes to show per image")->check(CLI::PositiveNumber)->capture_default_str();
  command->add_flag("--json", options->json, "print a JSON array, one object per image");
  command->add_option("--batch-size", options->batch_size, "images per forward pass")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  add_device_args(command, options->device, options->threads);
  command->add_option("inputs", options->inputs, "image files or directories")->required();
  command->callback([options, &status] { status = run_predict(*options); });
}

}  // namespace vit::app
