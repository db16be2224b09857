// `vit export-attention`: per image, the model's attention tensors, the maps of --method, overlays, faithfulness
// curves and summary.json under DIR/<image stem>/ (src/explain/attention_export_run.h); DIR/summary.json and
// DIR/index.html, a gallery that opens from disk.
#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "util/fs.h"
#include "util/log.h"
#include "util/progress.h"
#include "util/runtime.h"
#include "util/text.h"
#include "vit/build_config.h"
#if VIT_WITH_OPENCV
#include "explain/attention_export_run.h"
#endif

namespace vit::app {
namespace {

struct ExportAttentionOptions {
  ImageModelArgs image_model;
  std::string out;                // DIR
  std::string layers = "all";     // blocks to write and draw
  std::string heads = "all";      // heads in the grid and the per-layer head mean
  std::string rollout = "mean";   // head fusion of attention rollout
  double discard_ratio = 0.0;     // lowest fraction of fused attention dropped per block
  std::string method = "rollout"; // --method: maps to compute (all or a list)
  bool grad_rollout = false;      // --grad-rollout: adds grad-rollout to the methods (the older spelling)
  int64_t start_layer = 0;        // attribution's first block
  int64_t target_class = -1;      // --class (-1: the predicted class)
  std::string colormap = "jet";
  double alpha = 0.5;             // heatmap opacity
  std::string format = "both";    // png | npy | both
  bool faithfulness = false;      // deletion curves in summary.json
  std::string mask_heads;         // "L:H,L:H"
  int topk = 5;
};

#if VIT_WITH_OPENCV
int run_export_attention(const ExportAttentionOptions& o) {
  auto model = load_image_model(o.image_model);
  const ModelConfig& config = model.config();
  AttentionExportOptions options;
  options.limits = o.image_model.limits;
  options.layers = parse_index_list(o.layers, config.depth, "--layers");
  options.heads = parse_index_list(o.heads, config.num_heads, "--heads");
  options.fusion = o.rollout;
  options.discard_ratio = o.discard_ratio;
  options.methods = parse_methods(o.method);
  if (o.grad_rollout && std::find(options.methods.begin(), options.methods.end(), MapMethod::grad_rollout) ==
                            options.methods.end()) {
    options.methods.push_back(MapMethod::grad_rollout);
  }
  options.start_layer = o.start_layer;
  options.target_class = o.target_class >= 0 ? o.target_class : kPredictedClass;
  options.colormap = o.colormap;
  options.alpha = o.alpha;
  options.write_png = o.format != "npy";
  options.write_npy = o.format != "png";
  options.faithfulness = o.faithfulness;
  options.topk = o.topk;
  const auto files = start_image_run(model, o.image_model);
  // Head ablation as in evaluate: the masked heads' maps are still exported, their outputs are zeroed downstream.
  // After the move: the mask is a plain tensor that lives on the device of the model's parameters at this point.
  for (const auto& [layer, heads] : parse_head_mask(o.mask_heads)) model.net->set_head_mask(layer, heads);
  ProgressOptions shown;
  shown.show = files.size() > 1;  // each image takes a while: worth a bar from the second one on
  Progress progress(static_cast<int64_t>(files.size()), "export-attention", "img", shown);
  const AttentionExportRun exported = run_attention_export(
      model, files, o.out, options, o.mask_heads,
      [&](const std::string& path, const AttentionExportResult* result, const std::string& error, double seconds) {
        progress.clear();  // the line below takes the bar's place (stdout may share its terminal)
        if (result == nullptr) {
          log::error(error);
          std::printf("%s: error: %s\n", printable(path).c_str(), printable(error).c_str());
        } else {
          const auto& prediction = result->summary.at("prediction").at("topk").at(0);
          std::printf("%s: %s (%.4f) -> %s/%s/ [%.2f s]\n", printable(path).c_str(),
                      printable(prediction.at("label").get<std::string>()).c_str(),
                      prediction.at("prob").get<double>(), o.out.c_str(), printable(result->dir_name).c_str(),
                      seconds);
        }
        std::fflush(stdout);
        progress.advance();
      });
  progress.finish();
  const auto& errors = exported.errors;
  std::printf("gallery: %s/index.html\n", o.out.c_str());

  if (!errors.empty()) {
    log::error(std::to_string(errors.size()) + " of " + std::to_string(files.size()) +
               " images could not be exported");
  }
  return inputs_status(errors.size(), files.size());
}
#else
int run_export_attention(const ExportAttentionOptions&) { needs_opencv("export-attention"); }
#endif

// [0, 1): a discard ratio of 1 would drop every entry.
const CLI::Validator kDiscardRatio(
    [](std::string& text) -> std::string {
      double value = 0.0;
      if (!CLI::detail::lexical_cast(text, value) || !(value >= 0.0 && value < 1.0)) {
        return "discard ratio " + text + " is outside [0, 1)";
      }
      return {};
    },
    "in [0, 1)", "discard-ratio");

}  // namespace

void setup_export_attention(CLI::App& app, int& status) {
  auto options = std::make_shared<ExportAttentionOptions>();
  auto* command = app.add_subcommand(
      "export-attention",
      "Export attention maps, rollout, gradient rollout, transformer attribution and Grad-CAM, overlays, faithfulness "
      "curves and an HTML gallery for images (files or folders)");
  add_image_model_args(command, options->image_model);
  command->add_option("--out", options->out, "output directory: DIR/<image stem>/ per image, DIR/index.html")
      ->required();
  command->add_option("--layers", options->layers,
                      "blocks whose attn_<layer>.npy/.png and grid rows are written: all or i,j,... "
                      "(rollout always uses every block)")
      ->capture_default_str();
  command->add_option("--heads", options->heads,
                      "heads shown in the grid and averaged in attn_<layer>.png: all or i,j,... "
                      "(.npy files always hold every head)")
      ->capture_default_str();
  command->add_option("--rollout", options->rollout, "attention rollout head fusion")
      ->check(CLI::IsMember({"mean", "max", "min"}))
      ->capture_default_str();
  command->add_option("--discard-ratio", options->discard_ratio,
                      "per block, drop this lowest fraction of fused attention (never the class token's column)")
      ->check(kDiscardRatio)
      ->capture_default_str();
  command->add_option("--method", options->method,
                      "maps to compute: all, or a list of raw (last block's attention), rollout, grad-rollout, "
                      "attribution (Chefer et al. 2021), gradcam (attention Grad-CAM)")
      ->capture_default_str();
  command->add_flag("--grad-rollout", options->grad_rollout, "also gradient rollout (same as adding it to --method)");
  command->add_option("--start-layer", options->start_layer, "attribution: the first block that contributes")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command->add_option("--class", options->target_class,
                      "class explained by grad-rollout, attribution and gradcam and measured by --faithfulness "
                      "(default: each image's predicted class)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--colormap", options->colormap, "heatmap colours")
      ->check(CLI::IsMember({"jet", "viridis", "inferno", "turbo"}))
      ->capture_default_str();
  command->add_option("--alpha", options->alpha, "heatmap opacity over the image")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  command->add_option("--format", options->format, "png: overlays only, npy: raw arrays only, both")
      ->check(CLI::IsMember({"png", "npy", "both"}))
      ->capture_default_str();
  command->add_flag("--faithfulness", options->faithfulness,
                    "deletion, insertion and positive/negative perturbation curves per method and for a random "
                    "order: summary.json, faithfulness.png and the gallery's table");
  command->add_option("--mask-heads", options->mask_heads,
                      "switch off heads, e.g. 3:1,5:0 (LAYER:HEAD); their maps are still exported");
  command->add_option("--topk", options->topk, "predictions listed per image")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->callback([options, &status] { status = run_export_attention(*options); });
}

}  // namespace vit::app
