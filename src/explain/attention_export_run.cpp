// `vit export-attention` over many images, one at a time.
#include "explain/attention_export_run.h"

#include <chrono>
#include <set>
#include <sstream>
#include <stdexcept>

#include "explain/gallery.h"
#include "infer/inputs.h"
#include "util/fs.h"
#include "util/text.h"

namespace vit {

AttentionExportRun export_attention_images(LoadedModel& model, const std::vector<std::string>& paths,
                                           const std::string& out_dir, const AttentionExportOptions& options,
                                           const AttentionExportProgress& on_image) {
  make_dirs(out_dir);
  AttentionExportRun run;
  std::set<std::string> taken;
  for (const auto& path : paths) {
    const auto start = std::chrono::steady_clock::now();
    auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
    const PreparedImage image =
        std::move(prepare_images({path}, model.preprocess, model.config(), options.limits, /*keep_bgr=*/true).front());
    if (!image.ok()) {
      run.errors.push_back({path, image.error});
      if (on_image) on_image(path, nullptr, image.error, seconds());
      continue;
    }
    const std::string dir_name = unique_dir_name(path, taken);
    run.results.push_back(
        export_image_attention(model, path, image.image_bgr, image.input, out_dir, dir_name, options));
    if (on_image) on_image(path, &run.results.back(), "", seconds());
  }
  return run;
}

namespace {

double trapezoid(const std::vector<double>& x, const std::vector<double>& y) {
  double area = 0.0;
  for (size_t i = 1; i < x.size() && i < y.size(); ++i) area += (x[i] - x[i - 1]) * 0.5 * (y[i] + y[i - 1]);
  return area;
}

}  // namespace

nlohmann::ordered_json faithfulness_overview(const std::vector<AttentionExportResult>& results) {
  std::vector<const nlohmann::ordered_json*> measured;
  for (const auto& result : results) {
    if (result.summary.contains("faithfulness")) measured.push_back(&result.summary.at("faithfulness"));
  }
  if (measured.empty()) return nullptr;
  const auto& first = *measured.front();
  for (const auto* f : measured) {
    // One model, one grid: every image has the same levels and methods; anything else is a bug, not an input.
    if (f->at("metrics") != first.at("metrics") || f->at("curves").size() != first.at("curves").size()) {
      throw std::logic_error("faithfulness_overview: images measured with different levels or methods");
    }
  }
  const auto n = static_cast<double>(measured.size());
  nlohmann::ordered_json curves = nlohmann::ordered_json::object();
  nlohmann::ordered_json table = nlohmann::ordered_json::array();
  for (const auto& [key, unused] : first.at("curves").items()) {
    nlohmann::ordered_json per_metric = nlohmann::ordered_json::object();
    nlohmann::ordered_json row = {{"method", key}};
    for (const auto& [metric, definition] : first.at("metrics").items()) {
      const auto fractions = definition.at("fractions").get<std::vector<double>>();
      std::vector<double> probs(fractions.size(), 0.0), top1(fractions.size(), 0.0);
      double auc = 0.0;
      for (const auto* f : measured) {
        const auto& curve = f->at("curves").at(key).at(metric);
        const auto p = curve.at("probs").get<std::vector<double>>();
        const auto t = curve.at("top1").get<std::vector<int>>();
        for (size_t i = 0; i < fractions.size(); ++i) probs[i] += p.at(i) / n, top1[i] += t.at(i) / n;
        auc += curve.at("auc").get<double>() / n;
      }
      const double accuracy_auc = trapezoid(fractions, top1);
      per_metric[metric] = {{"probs", probs}, {"accuracy", top1}, {"auc", auc}, {"accuracy_auc", accuracy_auc}};
      row[metric] = auc;
      if (metric == "positive" || metric == "negative") row[metric + "_accuracy"] = accuracy_auc;
    }
    curves[key] = per_metric;
    table.push_back(row);
  }
  // How often each method's deletion beats the random order's on the same image.
  for (auto& row : table) {
    const std::string key = row.at("method");
    if (key == "random") continue;
    int wins = 0;
    for (const auto* f : measured) {
      wins += f->at("curves").at(key).at("deletion").at("auc").get<double>() <
              f->at("curves").at("random").at("deletion").at("auc").get<double>();
    }
    row["deletion_beats_random"] = wins / n;
  }
  return {{"images", measured.size()},
          {"note", "means over the images; accuracy: the share of images whose prediction is still the explained "
                   "class at that level (accuracy_auc: its area)"},
          {"metrics", first.at("metrics")},
          {"curves", curves},
          {"table", table}};
}

void write_attention_summary(const std::string& out_dir, const nlohmann::ordered_json& run,
                             const AttentionExportRun& exported, nlohmann::ordered_json& faithfulness, bool write_png) {
  nlohmann::ordered_json summary = {{"format", kAttentionExportFormat}, {"format_version", kAttentionExportVersion},
                                    {"run", run}};
  nlohmann::ordered_json images = nlohmann::ordered_json::array();
  for (const auto& result : exported.results) {
    images.push_back({{"image", result.summary.at("image")}, {"dir", result.dir_name},
                      {"prediction", result.summary.at("prediction").at("label")}});
  }
  nlohmann::ordered_json errors = nlohmann::ordered_json::array();
  for (const auto& error : exported.errors) errors.push_back({{"image", error.image}, {"error", error.message}});
  summary["images"] = images;
  summary["errors"] = errors;
  if (!faithfulness.is_null()) {
    if (write_png) {
      write_faithfulness_plot(out_dir + "/faithfulness.png", faithfulness);  // the mean curves
      faithfulness["plot"] = "faithfulness.png";
    }
    summary["faithfulness"] = faithfulness;
  }
  write_file_atomic(out_dir + "/summary.json",
                    summary.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n");
}

AttentionExportRun run_attention_export(LoadedModel& model, const std::vector<std::string>& paths,
                                        const std::string& out_dir, const AttentionExportOptions& options,
                                        const std::string& masked_heads, const AttentionExportProgress& on_image) {
  const ModelConfig& config = model.config();
  check_attention_options(config, options, model.path);
  const AttentionExportRun exported = export_attention_images(model, paths, out_dir, options, on_image);
  const auto& [results, errors] = exported;
  const std::string model_text = size_text(config.img_h, config.img_w) + ", patch " +
                                 std::to_string(config.patch_size) + ", grid " +
                                 size_text(config.grid_h(), config.grid_w()) + ", " + std::to_string(config.depth) +
                                 " blocks x " + std::to_string(config.num_heads) + " heads";
  std::ostringstream rollout_text;
  rollout_text << options.fusion << " fusion, discard " << options.discard_ratio;
  std::string methods_text;
  for (const MapMethod id : options.methods) {
    (methods_text += methods_text.empty() ? "" : ", ") += explain_method(id).name;
  }
  nlohmann::ordered_json run = {{"checkpoint", model.path}, {"model", model_text}, {"methods", methods_text},
                                {"rollout", rollout_text.str()}};
  run["explained class"] = options.target_class != kPredictedClass
                               ? "class " + model.class_names.at(options.target_class)
                               : std::string("the predicted class of each image");
  if (!masked_heads.empty()) run["masked heads"] = masked_heads;
  run["images"] = std::to_string(results.size()) + " exported" +
                  (errors.empty() ? std::string() : ", " + std::to_string(errors.size()) + " failed");
  auto faithfulness = faithfulness_overview(results);
  write_attention_summary(out_dir, run, exported, faithfulness, options.write_png);
  write_gallery(out_dir, results, errors, run, options.colormap, options.alpha, faithfulness);
  return exported;
}

}  // namespace vit
