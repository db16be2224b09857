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

#include "explain/rollout.h"
#include "io/model_file.h"

namespace vit {

inline constexpr const char* kAttentionExportFormat = "vit-attention-export";
inline constexpr int kAttentionExportVersion = 1;

struct ExportOptions {
  std::vector<int64_t> layers;        // blocks whose attn_<layer>.npy/.png and grid rows are written (empty = all)
  std::vector<int64_t> heads;         // heads shown in the grid and averaged in attn_<layer>.png (empty = all)
  std::string fusion = "mean";        // attention rollout head fusion: mean | max | min
  double discard_ratio = 0.0;         // per block, the lowest fraction of fused attention dropped (class column kept)
  bool grad_rollout = false;          // also the class-specific gradient rollout
  int64_t target_class = kPredictedClass;  // gradient rollout's class (kPredictedClass = the prediction)
  std::string colormap = "jet";       // jet | viridis | inferno | turbo
  double alpha = 0.5;                 // heatmap opacity in the overlays
  bool write_png = true;              // overlays, contact sheet and the gallery's preview.png
  bool write_npy = true;              // attn_<layer>.npy, rollout.npy, grad_rollout.npy
  bool faithfulness = false;          // deletion curves: heatmap order against a random order
  int64_t faithfulness_steps = 32;    // deletion levels after the intact image (capped at the patch count)
  uint64_t random_seed = 0;           // seed of the random deletion order
  int64_t topk = 5;                   // predictions listed in summary.json
};

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
struct ExportResult {
  nlohmann::ordered_json summary;   // exactly what summary.json holds, keys in a readable order
  std::string dir_name;             // the image's folder under DIR
  std::vector<int64_t> layers;      // grid rows (block indices)
  std::vector<int64_t> heads;       // grid columns (head indices)
  torch::Tensor head_maps;          // (layers, heads, gh, gw) float32 class-token attention, each map / its max
  torch::Tensor head_on;            // (layers, heads) bool: false = head switched off by --mask-heads
  ModelView view;                   // where on the image the maps lie
};

// The folder name for an image: its file stem ("image" when the stem is empty, "." or ".."), suffixed "-2", "-3",
// ... when `taken` already holds it; the result is added to `taken`.
std::string unique_dir_name(const std::string& image_path, std::set<std::string>& taken);

// "all" (or "") -> 0..count-1; "2,0,5" -> {2, 0, 5}. Throws std::invalid_argument naming `option` and the bad item
// or the allowed range; duplicates are an error too.
std::vector<int64_t> parse_index_list(const std::string& text, int64_t count, const std::string& option);

// Exports one image into out_dir/dir_name/. image_bgr: the decoded image at its own resolution (overlays are drawn
// on it); input: the same image through the shared preprocessing, (C, H, W) at the model's size. The model should be
// in eval mode with any head mask already set. Returns the summary (also written) and the gallery's maps.
ExportResult export_image_attention(LoadedModel& model, const std::string& image_path, const cv::Mat& image_bgr,
                                    const torch::Tensor& input, const std::string& out_dir, const std::string& dir_name,
                                    const ExportOptions& options);

}  // namespace vit
