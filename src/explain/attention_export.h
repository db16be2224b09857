// `vit export-attention` for one image: the model's attention tensors, rollout maps, overlays at the image's own
// resolution, the layer x head contact sheet, optional deletion curves and summary.json. Vision library (OpenCV).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <torch/torch.h>

#include "data/image.h"
#include "explain/rollout.h"
#include "io/model_file.h"

namespace vit {

inline constexpr const char* kAttentionExportFormat = "vit-attention-export";
inline constexpr int kAttentionExportVersion = 2;  // 2: --method maps, faithfulness per method and metric

// The maps export-attention can compute (--method); formulas in rollout.h.
enum class MapMethod { raw, rollout, grad_rollout, attribution, gradcam };
struct ExplainMethod {
  MapMethod id;
  const char* name;       // on the command line: raw | rollout | grad-rollout | attribution | gradcam
  const char* key;        // file stem and JSON key: raw, rollout, grad_rollout, attribution, gradcam
  const char* title;      // in the gallery and the plots
  bool class_specific;    // needs the gradient of a class score
  const char* definition; // summary.json's method.maps[].definition
};
const std::vector<ExplainMethod>& explain_methods();
const ExplainMethod& explain_method(MapMethod id);
// "all" -> every method; "rollout,attribution" -> those, in the order given. Throws std::invalid_argument naming
// an unknown or repeated method and the allowed names.
std::vector<MapMethod> parse_methods(const std::string& text);

struct AttentionExportOptions {
  ImageLimits limits;                 // per input file: larger files and images are refused undecoded
  std::vector<int64_t> layers;        // blocks whose attn_<layer>.npy/.png and grid rows are written (empty = all)
  std::vector<int64_t> heads;         // heads shown in the grid and averaged in attn_<layer>.png (empty = all)
  std::vector<MapMethod> methods = {MapMethod::rollout};  // maps written as <key>.npy / <key>.png, in this order
  std::string fusion = "mean";        // attention rollout head fusion: mean | max | min
  double discard_ratio = 0.0;         // per block, the lowest fraction of fused attention dropped (class column kept)
  int64_t start_layer = 0;            // attribution: the first block that contributes
  int64_t target_class = kPredictedClass;  // the class explained by the class-specific maps and measured by the
                                           // faithfulness curves (kPredictedClass = the prediction)
  std::string colormap = "jet";       // jet | viridis | inferno | turbo
  double alpha = 0.5;                 // heatmap opacity in the overlays
  bool write_png = true;              // overlays, contact sheet, faithfulness.png and the gallery's preview.png
  bool write_npy = true;              // attn_<layer>.npy and one <key>.npy per method
  bool faithfulness = false;          // deletion, insertion and perturbation curves per method, and a random order
  int64_t faithfulness_steps = 32;    // deletion / insertion levels after the intact image (capped at the patches)
  uint64_t random_seed = 0;           // seed of the random order
  int64_t topk = 5;                   // predictions listed in summary.json
};

// Throws std::invalid_argument naming `model_path` when the options cannot explain this model: no classifier head,
// --start-layer or --class out of range, an unknown head fusion or colormap. export_image_attention() checks each
// image with it; the run (attention_export_run.h) once before the first image.
void check_attention_options(const ModelConfig& config, const AttentionExportOptions& options,
                             const std::string& model_path);

// The part of the original image the model sees, as fractions of its height and width: all of it for crop_pct 1
// (a plain resize), else the centre crop's window, from the same sizes preprocess() computes. Heatmaps cover only
// this window; the rest of an overlay is dimmed.
struct ModelView {
  double top = 0.0, left = 0.0, bottom = 1.0, right = 1.0;
  bool whole() const { return top == 0.0 && left == 0.0 && bottom == 1.0 && right == 1.0; }
  // The window in pixels of an image of this size (at least 1 x 1).
  cv::Rect in(cv::Size size) const;
};
ModelView model_view(int64_t image_h, int64_t image_w, const Preprocess& preprocess, int64_t height, int64_t width);

// overlay_heatmap() on the model's window of the image; outside it the image is dimmed to half brightness.
cv::Mat overlay_in_view(const cv::Mat& image_bgr, const cv::Mat& heat01, const ModelView& view,
                        const std::string& colormap, double alpha, int interpolation = cv::INTER_CUBIC);

// One exported image: summary.json's content plus what the gallery draws from.
struct AttentionExportResult {
  nlohmann::ordered_json summary;   // exactly what summary.json holds, keys in a readable order
  std::string dir_name;             // the image's folder under DIR
  std::vector<int64_t> layers;      // grid rows (block indices)
  std::vector<int64_t> heads;       // grid columns (head indices)
  torch::Tensor head_maps;          // (layers, heads, gh, gw) float32 class-token attention, each map / its max
  torch::Tensor head_on;            // (layers, heads) bool: false = head switched off by --mask-heads
  ModelView view;                   // where on the image the maps lie
};

// faithfulness.png: deletion, insertion, positive and negative perturbation panels, one curve per method (and the
// random order) with its AUC, from summary.json's "faithfulness" object (or the folder's mean of them).
void write_faithfulness_plot(const std::string& path, const nlohmann::ordered_json& faithfulness);

// The folder name for an image: its file stem ("image" when the stem is empty, "." or ".."), suffixed "-2", "-3",
// ... when `taken` already holds it; the result is added to `taken`.
std::string unique_dir_name(const std::string& image_path, std::set<std::string>& taken);

// "all" (or "") -> 0..count-1; "2,0,5" -> {2, 0, 5}. Throws std::invalid_argument naming `option` and the bad item
// or the allowed range; duplicates are an error too.
std::vector<int64_t> parse_index_list(const std::string& text, int64_t count, const std::string& option);

// Exports one image into out_dir/dir_name/. image_bgr: the decoded image at its own resolution (overlays are drawn
// on it); input: the same image through the shared preprocessing, (C, H, W) at the model's size. The model should be
// in eval mode with any head mask already set. Returns the summary (also written) and the gallery's maps.
AttentionExportResult export_image_attention(LoadedModel& model, const std::string& image_path,
                                             const cv::Mat& image_bgr, const torch::Tensor& input,
                                             const std::string& out_dir, const std::string& dir_name,
                                             const AttentionExportOptions& options);

}  // namespace vit
