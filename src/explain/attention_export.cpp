// One image's attention export: .npy tensors, rollout maps, overlays, the layer x head contact sheet, deletion
// curves and summary.json (formats and formulas in export.h and rollout.h).
#include "explain/attention_export.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include <opencv2/imgproc.hpp>

#include "data/image.h"
#include "image/draw.h"
#include "io/npy.h"
#include "util/fs.h"

namespace vit {
namespace {

constexpr int kPreviewSide = 960;  // preview.png's long side: the gallery's backdrop, sharp enough for its large view
constexpr int kCellWidth = 128;    // contact sheet cell width in pixels

const cv::Scalar kInk(40, 40, 40), kMaskedRed(40, 40, 210), kPaper(255, 255, 255), kFrame(200, 200, 200);

const char* kRolloutDefinition =
    "R = I; per block in order: F = head fusion of the attention (heads off by --mask-heads left out), drop the "
    "lowest discard_ratio of F's entries outside the prefix tokens' columns, F = F + I, rows / row sums, R = F @ R; "
    "map = (readout @ R)[patches] reshaped to the grid, / max (readout: see method.rollout.readout)";
const char* kGradRolloutDefinition =
    "R = I; per block in order: G = d logit[class] / d attention, F = mean over heads of attention * max(G, 0), "
    "drop the lowest discard_ratio of F outside the prefix tokens' columns, F = F + I, rows / row sums, R = F @ R; "
    "map = (readout @ R)[patches] reshaped to the grid, / max";

const char* kRawDefinition =
    "the last block's attention from the readout query (method.rollout.readout) to every patch, head mean over the "
    "heads that are on, / max";
const char* kAttributionDefinition =
    "R = I; per block from start_layer on: G = d logit[class] / d attention, Abar = mean over heads of "
    "max(G * attention, 0) (each head clamped, then averaged), R = R + Abar @ R; map = (readout @ R)[patches] "
    "reshaped to the grid, / max (Chefer, Gur & Wolf, ICCV 2021)";
const char* kGradcamDefinition =
    "last block: a_h = readout @ attention_h, g_h = readout @ (d logit[class] / d attention_h); w_h = mean of g_h "
    "over the patches; map = max(mean over heads of w_h * a_h[patches], 0) / max (attention Grad-CAM)";

// A (h, w) tensor as an owning CV_32F matrix.
cv::Mat to_mat(const torch::Tensor& map) {
  const auto m = map.to(torch::kCPU, torch::kFloat32).contiguous();
  return cv::Mat(static_cast<int>(m.size(0)), static_cast<int>(m.size(1)), CV_32F, m.data_ptr<float>()).clone();
}

std::string dump_json(const nlohmann::ordered_json& value) {
  // File names need not be valid UTF-8; replace bad bytes instead of failing the whole export.
  return value.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

// rows = layers, columns = heads: each cell the head's readout attention map over a small copy of the image, masked
// heads framed in red and labelled; a colour bar explains the scale.
cv::Mat draw_contact_sheet(const cv::Mat& preview, const AttentionExportResult& result, const std::string& colormap,
                           double alpha, const std::string& title) {
  const int rows = static_cast<int>(result.layers.size()), cols = static_cast<int>(result.heads.size());
  const int cell_w = kCellWidth;
  const auto aspect_h = static_cast<int>(std::lround(static_cast<double>(cell_w) * preview.rows / preview.cols));
  const int cell_h = std::clamp(aspect_h, 48, 2 * kCellWidth);
  const int outer = 12, label_w = 78, title_h = 50, header_h = 24, gap = 6, footer_h = 46;
  const std::string subtitle = "attention of the head's query per layer x head, each map divided by its max";
  int baseline = 0;
  const int text_w = std::max(cv::getTextSize(title, cv::FONT_HERSHEY_SIMPLEX, 0.55, 1, &baseline).width,
                              cv::getTextSize(subtitle, cv::FONT_HERSHEY_SIMPLEX, 0.42, 1, &baseline).width);
  const int grid_w = cols * (cell_w + gap) - gap;
  const int width = std::max({outer + label_w + grid_w + outer, outer + text_w + outer, 440});
  const int height = title_h + header_h + rows * (cell_h + gap) - gap + footer_h;
  cv::Mat canvas(height, width, CV_8UC3, kPaper);
  put_label(canvas, title, {outer, 22}, 0.55, kInk);
  put_label(canvas, subtitle, {outer, 42}, 0.42, kInk);

  cv::Mat base;
  cv::resize(preview, base, cv::Size(cell_w, cell_h), 0, 0, cv::INTER_AREA);
  const auto on = result.head_on.accessor<bool, 2>();
  for (int c = 0; c < cols; ++c) {
    const std::string header = "head " + std::to_string(result.heads[c]);
    const int x = outer + label_w + c * (cell_w + gap);
    put_label(canvas, header, {x + cell_w / 2 - 22, title_h + 16}, 0.45, kInk);
  }
  for (int r = 0; r < rows; ++r) {
    const int y = title_h + header_h + r * (cell_h + gap);
    put_label(canvas, "layer " + std::to_string(result.layers[r]), {outer, y + cell_h / 2 + 5}, 0.45, kInk);
    for (int c = 0; c < cols; ++c) {
      const int x = outer + label_w + c * (cell_w + gap);
      const cv::Rect box(x, y, cell_w, cell_h);
      // Nearest-neighbour upsampling keeps one colour per patch: the map's real resolution.
      overlay_in_view(base, to_mat(result.head_maps[r][c]), result.view, colormap, alpha, cv::INTER_NEAREST)
          .copyTo(canvas(box));
      if (on[r][c]) {
        cv::rectangle(canvas, box, kFrame, 1);
      } else {
        cv::rectangle(canvas, box, kMaskedRed, 3);
        cv::rectangle(canvas, {x + 3, y + cell_h - 22, 62, 19}, kPaper, cv::FILLED);
        cv::putText(canvas, "masked", {x + 6, y + cell_h - 8}, cv::FONT_HERSHEY_SIMPLEX, 0.45, kMaskedRed, 1,
                    cv::LINE_AA);
      }
    }
  }
  // Colour bar: what the colours mean (every map is divided by its own max).
  const int bar_y = height - footer_h + 14, bar_x = outer + label_w, bar_w = 200;
  cv::Mat ramp(1, bar_w, CV_32F);
  for (int i = 0; i < bar_w; ++i) ramp.at<float>(0, i) = static_cast<float>(i) / (bar_w - 1);
  cv::Mat bar;
  cv::resize(colorize(ramp, colormap), bar, cv::Size(bar_w, 12), 0, 0, cv::INTER_NEAREST);
  bar.copyTo(canvas(cv::Rect(bar_x, bar_y, bar_w, 12)));
  put_label(canvas, "0", {bar_x - 14, bar_y + 11}, 0.4, kInk);
  put_label(canvas, "map max", {bar_x + bar_w + 6, bar_y + 11}, 0.4, kInk);
  put_label(canvas, "red frame: head switched off (--mask-heads)", {bar_x, bar_y + 30}, 0.4, kMaskedRed);
  return canvas;
}

nlohmann::ordered_json curve_json(const PerturbationCurve& curve) {
  return {{"probs", curve.probs}, {"top1", curve.top1}, {"auc", curve.auc}};
}

// The four faithfulness curves of one importance order.
struct FaithfulnessCurves {
  PerturbationCurve deletion, insertion, positive, negative;
  nlohmann::ordered_json json() const {
    return {{"deletion", curve_json(deletion)}, {"insertion", curve_json(insertion)},
            {"positive", curve_json(positive)}, {"negative", curve_json(negative)}};
  }
};
FaithfulnessCurves faithfulness_of(VisionTransformer& net, const torch::Tensor& input,
                                   const std::vector<int64_t>& order, int64_t target, int64_t steps) {
  return {deletion_curve(net, input, order, target, steps), insertion_curve(net, input, order, target, steps),
          positive_perturbation(net, input, order, target), negative_perturbation(net, input, order, target)};
}

}  // namespace

void write_faithfulness_plot(const std::string& path, const nlohmann::ordered_json& faithfulness) {
  static const std::vector<std::pair<std::string, std::string>> kPanels = {
      {"deletion", "deletion (lower AUC is better)"},
      {"insertion", "insertion (higher is better)"},
      {"positive", "positive perturbation (lower is better)"},
      {"negative", "negative perturbation (higher is better)"}};
  std::vector<CurvePanel> panels;
  for (const auto& [metric, heading] : kPanels) {
    CurvePanel panel;
    panel.title = heading;
    panel.legend_below = metric == "insertion";  // its curves rise to the upper right
    panel.x = faithfulness.at("metrics").at(metric).at("fractions").get<std::vector<double>>();
    panel.x_label = metric == "insertion" ? "fraction of patches restored" : "fraction of patches blanked";
    for (const auto& [key, curves] : faithfulness.at("curves").items()) {
      const auto& curve = curves.at(metric);
      char name[64];
      std::snprintf(name, sizeof name, "%s %.3f", key.c_str(), curve.at("auc").get<double>());
      panel.curves.push_back({name, curve.at("probs").get<std::vector<double>>()});
    }
    panels.push_back(std::move(panel));
  }
  plot_curves(path, panels);
}

const std::vector<ExplainMethod>& explain_methods() {
  static const std::vector<ExplainMethod> methods = {
      {MapMethod::raw, "raw", "raw", "raw attention (last block)", false, kRawDefinition},
      {MapMethod::rollout, "rollout", "rollout", "attention rollout", false, kRolloutDefinition},
      {MapMethod::grad_rollout, "grad-rollout", "grad_rollout", "gradient rollout", true, kGradRolloutDefinition},
      {MapMethod::attribution, "attribution", "attribution", "transformer attribution", true,
       kAttributionDefinition},
      {MapMethod::gradcam, "gradcam", "gradcam", "attention Grad-CAM", true, kGradcamDefinition},
  };
  return methods;
}

const ExplainMethod& explain_method(MapMethod id) {
  for (const auto& method : explain_methods()) {
    if (method.id == id) return method;
  }
  throw std::logic_error("explain_method: a MapMethod without a table entry");
}

std::vector<MapMethod> parse_methods(const std::string& text) {
  std::string allowed;
  for (const auto& method : explain_methods()) (allowed += allowed.empty() ? "" : ", ") += method.name;
  std::vector<MapMethod> out;
  if (text == "all") {
    for (const auto& method : explain_methods()) out.push_back(method.id);
    return out;
  }
  std::stringstream list(text);
  std::string item;
  while (std::getline(list, item, ',')) {
    const auto found = std::find_if(explain_methods().begin(), explain_methods().end(),
                                    [&](const ExplainMethod& m) { return item == m.name; });
    if (found == explain_methods().end()) {
      throw std::invalid_argument("--method: unknown method \"" + item + "\" (allowed: all or " + allowed + ")");
    }
    if (std::find(out.begin(), out.end(), found->id) != out.end()) {
      throw std::invalid_argument("--method: " + item + " is listed twice");
    }
    out.push_back(found->id);
  }
  if (out.empty()) {
    throw std::invalid_argument("--method: \"" + text + "\" lists no method (allowed: all or " + allowed + ")");
  }
  return out;
}

cv::Rect ModelView::in(cv::Size size) const {
  const int x0 = static_cast<int>(std::lround(left * size.width));
  const int y0 = static_cast<int>(std::lround(top * size.height));
  const int x1 = std::max(x0 + 1, static_cast<int>(std::lround(right * size.width)));
  const int y1 = std::max(y0 + 1, static_cast<int>(std::lround(bottom * size.height)));
  return cv::Rect(x0, y0, std::min(x1, size.width) - x0, std::min(y1, size.height) - y0);
}

ModelView model_view(int64_t image_h, int64_t image_w, const Preprocess& preprocess, int64_t height, int64_t width) {
  const auto [resize_h, resize_w] = eval_resize_shape(image_h, image_w, preprocess, height, width);  // as preprocess()
  const int64_t top = centre_crop_offset(resize_h, height, preprocess.crop_offset);
  const int64_t left = centre_crop_offset(resize_w, width, preprocess.crop_offset);
  ModelView view;
  view.top = static_cast<double>(top) / resize_h;
  view.bottom = static_cast<double>(top + height) / resize_h;
  view.left = static_cast<double>(left) / resize_w;
  view.right = static_cast<double>(left + width) / resize_w;
  return view;
}

cv::Mat overlay_in_view(const cv::Mat& image_bgr, const cv::Mat& heat01, const ModelView& view,
                        const std::string& colormap, double alpha, int interpolation) {
  if (view.whole()) return overlay_heatmap(image_bgr, heat01, colormap, alpha, interpolation);
  const cv::Rect window = view.in(image_bgr.size());
  cv::Mat out;
  image_bgr.convertTo(out, -1, 0.5, 0.0);  // the part the model never saw, dimmed
  overlay_heatmap(image_bgr(window), heat01, colormap, alpha, interpolation).copyTo(out(window));
  return out;
}

std::string unique_dir_name(const std::string& image_path, std::set<std::string>& taken) {
  std::string stem = std::filesystem::path(image_path).stem().string();
  if (stem.empty() || stem == "." || stem == "..") stem = "image";
  std::string name = stem;
  for (int n = 2; taken.count(name) > 0; ++n) name = stem + "-" + std::to_string(n);
  taken.insert(name);
  return name;
}

std::vector<int64_t> parse_index_list(const std::string& text, int64_t count, const std::string& option) {
  std::vector<int64_t> out;
  if (text.empty() || text == "all") {
    for (int64_t i = 0; i < count; ++i) out.push_back(i);
    return out;
  }
  std::stringstream list(text);
  std::string item;
  while (std::getline(list, item, ',')) {
    int64_t value = -1;
    try {
      size_t used = 0;
      value = std::stoll(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw std::invalid_argument(option + ": \"" + item + "\" is not an index (expected all or i,j,...)");
    }
    if (value < 0 || value >= count) {
      throw std::invalid_argument(option + ": " + std::to_string(value) + " is out of range [0, " +
                                  std::to_string(count) + ")");
    }
    if (std::find(out.begin(), out.end(), value) != out.end()) {
      throw std::invalid_argument(option + ": " + std::to_string(value) + " is listed twice");
    }
    out.push_back(value);
  }
  if (out.empty()) throw std::invalid_argument(option + ": \"" + text + "\" lists no index");
  return out;
}

void check_attention_options(const ModelConfig& config, const AttentionExportOptions& options,
                             const std::string& model_path) {
  check_head_fusion(options.fusion);
  check_colormap(options.colormap);
  if (config.num_classes <= 0) {
    throw std::invalid_argument(model_path + ": the model has no classifier head (num_classes 0): nothing to explain");
  }
  if (options.start_layer < 0 || options.start_layer >= config.depth) {
    throw std::invalid_argument("--start-layer " + std::to_string(options.start_layer) + " is out of range [0, " +
                                std::to_string(config.depth) + ") for " + model_path);
  }
  if (options.target_class != kPredictedClass &&
      (options.target_class < 0 || options.target_class >= config.num_classes)) {
    throw std::invalid_argument("--class " + std::to_string(options.target_class) + " is out of range [0, " +
                                std::to_string(config.num_classes) + ") for " + model_path);
  }
}

namespace {

// What one image's explanation computes before anything is written: the captured attention (and gradients), the
// prediction, the class the class-specific maps explain, one (gh, gw) map per method, and the per-head maps.
struct ImageMaps {
  std::vector<const ExplainMethod*> methods;  // in the order asked for
  AttentionCapture capture;
  std::vector<torch::Tensor> keep;  // per block (nh): 1 = the head is on
  torch::Tensor readout;            // (N): the query the head reads
  nlohmann::ordered_json topk;      // [{index, label, prob}]
  int64_t predicted = 0;
  int64_t target = 0;               // the class of the class-specific maps and the faithfulness curves
  std::string class_source;         // "predicted" | "--class"
  std::vector<torch::Tensor> maps;  // per method (gh, gw)
};

// Step 1: the forward (and backward) pass, the prediction, every method's map, and result's per-head maps.
ImageMaps compute_maps(LoadedModel& model, const torch::Tensor& input, const AttentionExportOptions& options,
                       AttentionExportResult& result) {
  const ModelConfig& config = model.config();
  // The grid comes from the model's input size, never from sqrt(N): rectangular models work.
  const int64_t grid_h = config.grid_h(), grid_w = config.grid_w();
  const int64_t prefix = model.net->num_prefix_tokens();
  ImageMaps out;
  for (const MapMethod id : options.methods) out.methods.push_back(&explain_method(id));
  const bool class_specific =
      std::any_of(out.methods.begin(), out.methods.end(), [](auto* m) { return m->class_specific; });
  out.capture = capture_attention(model.net, input, class_specific ? options.target_class : -1);
  const AttentionCapture& capture = out.capture;
  out.keep = head_keep_masks(model.net);
  // The query the head reads (rollout.h): the class token, the patch mean, or a MAP head's pooling attention.
  out.readout = head_readout(config, capture.pool_attention);

  const auto probs = capture.logits.softmax(0);  // (K)
  const int64_t k = std::min<int64_t>(options.topk, config.num_classes);
  const auto [top_p, top_i] = probs.topk(k);
  out.topk = nlohmann::ordered_json::array();
  for (int64_t i = 0; i < k; ++i) {
    const int64_t index = top_i[i].item<int64_t>();
    out.topk.push_back({{"index", index}, {"label", model.class_names.at(index)}, {"prob", top_p[i].item<double>()}});
  }
  out.predicted = top_i[0].item<int64_t>();
  out.target = options.target_class == kPredictedClass ? out.predicted : options.target_class;
  out.class_source = options.target_class == kPredictedClass ? "predicted" : "--class";

  for (const ExplainMethod* method : out.methods) {
    torch::Tensor map;
    switch (method->id) {
      case MapMethod::raw:
        map = class_attention_mean(capture.attentions.back(), prefix, grid_h, grid_w, out.keep.back(), out.readout);
        break;
      case MapMethod::rollout:
        map = attention_rollout(capture.attentions, options.fusion, options.discard_ratio, prefix, grid_h, grid_w,
                                out.keep, out.readout);
        break;
      case MapMethod::grad_rollout:
        map = gradient_rollout(capture.attentions, capture.gradients, options.discard_ratio, prefix, grid_h, grid_w,
                               out.readout);
        break;
      case MapMethod::attribution:
        map = transformer_attribution(capture.attentions, capture.gradients, options.start_layer, prefix, grid_h,
                                      grid_w, out.readout);
        break;
      case MapMethod::gradcam:
        map = attention_gradcam(capture.attentions.back(), capture.gradients.back(), prefix, grid_h, grid_w,
                                out.readout);
        break;
    }
    out.maps.push_back(map);
  }

  // Per shown layer and head: the readout's attention map (the grid), and which of those heads are on.
  const auto heads_index = torch::tensor(result.heads, torch::kInt64);
  std::vector<torch::Tensor> layer_maps;
  result.head_on = torch::zeros({static_cast<int64_t>(result.layers.size()), static_cast<int64_t>(result.heads.size())},
                                torch::kBool);
  for (size_t r = 0; r < result.layers.size(); ++r) {
    const int64_t layer = result.layers[r];
    layer_maps.push_back(class_attention_maps(capture.attentions[layer], prefix, grid_h, grid_w, out.readout)
                             .index_select(0, heads_index));  // (heads, gh, gw)
    result.head_on[static_cast<int64_t>(r)].copy_(out.keep[layer].index_select(0, heads_index) > 0);
  }
  result.head_maps = torch::stack(layer_maps);  // (layers, heads, gh, gw)
  return out;
}

// Records the files of an image folder by role: a role written once holds a name, one set up as a list holds many.
struct FileRoles {
  nlohmann::ordered_json files = nlohmann::ordered_json::object();
  void list(const std::string& role) { files[role] = nlohmann::ordered_json::array(); }
  void add(const std::string& role, const std::string& name) {
    if (files.contains(role) && files[role].is_array()) files[role].push_back(name);
    else files[role] = name;
  }
};

// Step 2: the arrays: the chosen blocks' raw attention (all heads, exactly the probabilities the forward pass used),
// a MAP head's pooling attention, one map per method.
void write_arrays(const std::string& dir, const ImageMaps& maps, const AttentionExportResult& result, FileRoles& files) {
  files.list("attention_npy");
  for (int64_t layer : result.layers) {
    const std::string name = "attn_" + std::to_string(layer) + ".npy";
    write_npy(dir + "/" + name, maps.capture.attentions.at(layer));  // (nh, N, N)
    files.add("attention_npy", name);
  }
  if (maps.capture.pool_attention.defined()) {
    write_npy(dir + "/pool_attn.npy", maps.capture.pool_attention.squeeze(1));  // (nh, Np), or (nh, N) (Eva)
    files.add("pool_attention_npy", "pool_attn.npy");
  }
  for (size_t m = 0; m < maps.methods.size(); ++m) {
    const std::string key = maps.methods[m]->key;
    write_npy(dir + "/" + key + ".npy", maps.maps[m]);
    files.add(key + "_npy", key + ".npy");
  }
}

// Step 3: the pictures: a preview, one overlay per method, one per shown layer (the mean of its shown heads that are
// on), and the layer x head contact sheet.
void draw_overlays(const std::string& dir, const cv::Mat& image_bgr, const ModelConfig& config, const ImageMaps& maps,
                   const AttentionExportResult& result, const AttentionExportOptions& options, FileRoles& files) {
  const int64_t prefix = config.num_prefix_tokens();
  // Small copy for the gallery's backdrop and the contact sheet; overlays use the full image.
  const cv::Mat preview = fit_within(image_bgr, kPreviewSide);
  write_image(dir + "/preview.png", preview);
  files.add("preview_png", "preview.png");
  for (size_t m = 0; m < maps.methods.size(); ++m) {
    const std::string key = maps.methods[m]->key;
    write_image(dir + "/" + key + ".png",
                overlay_in_view(image_bgr, to_mat(maps.maps[m]), result.view, options.colormap, options.alpha));
    files.add(key + "_png", key + ".png");
  }
  files.list("layer_png");
  const auto heads_index = torch::tensor(result.heads, torch::kInt64);
  for (const int64_t layer : result.layers) {
    // Head mean over the shown heads that are on (all shown heads when every one of them is off).
    auto shown_on = torch::zeros({config.num_heads});
    shown_on.index_fill_(0, heads_index, 1.0);
    if ((shown_on * maps.keep[layer]).count_nonzero().item<int64_t>() > 0) shown_on *= maps.keep[layer];
    const auto mean_map = class_attention_mean(maps.capture.attentions[layer], prefix, config.grid_h(),
                                               config.grid_w(), shown_on, maps.readout);
    const std::string name = "attn_" + std::to_string(layer) + ".png";
    write_image(dir + "/" + name,
                overlay_in_view(image_bgr, to_mat(mean_map), result.view, options.colormap, options.alpha));
    files.add("layer_png", name);
  }
  write_image(dir + "/grid_layer_head.png",
              draw_contact_sheet(preview, result, options.colormap, options.alpha, result.dir_name));
  files.add("grid_png", "grid_layer_head.png");
}

// Step 4: summary.json's description of the maps: layers, heads, masked heads, each method (with its class when it
// is class-specific), rollout's settings, the drawing options.
nlohmann::ordered_json describe_method(const LoadedModel& model, const ImageMaps& maps,
                                       const AttentionExportResult& result, const AttentionExportOptions& options) {
  const ModelConfig& config = model.config();
  nlohmann::ordered_json masked = nlohmann::ordered_json::array();
  for (size_t layer = 0; layer < maps.keep.size(); ++layer) {
    for (int64_t h = 0; h < maps.keep[layer].size(0); ++h) {
      if (maps.keep[layer][h].item<float>() == 0.0f) masked.push_back({{"layer", layer}, {"head", h}});
    }
  }
  nlohmann::ordered_json method_list = nlohmann::ordered_json::array();
  for (const ExplainMethod* method : maps.methods) {
    nlohmann::ordered_json entry = {{"method", method->name}, {"key", method->key}, {"title", method->title},
                                    {"class_specific", method->class_specific}};
    if (method->class_specific) {
      entry["class"] = maps.target;
      entry["label"] = model.class_names.at(maps.target);
      entry["class_source"] = maps.class_source;
      entry["score"] = "logit (before softmax)";
    }
    if (method->id == MapMethod::attribution) entry["start_layer"] = options.start_layer;
    entry["definition"] = method->definition;
    method_list.push_back(entry);
  }
  nlohmann::ordered_json method = {
      {"attention", "explicit softmax probabilities of forward_features, the path predict uses (no fused kernel)"},
      {"layers", result.layers},
      {"heads", result.heads},
      {"masked_heads", masked},
      {"readout", head_readout_name(config)},
      {"maps", method_list},
      {"rollout", {{"head_fusion", options.fusion}, {"discard_ratio", options.discard_ratio},
                   {"prefix_tokens", config.num_prefix_tokens()}, {"readout", head_readout_name(config)},
                   {"definition", kRolloutDefinition}}},
      {"colormap", options.colormap},
      {"alpha", options.alpha},
      {"format", options.write_png && options.write_npy ? "both" : options.write_png ? "png" : "npy"},
  };
  if (std::find(options.methods.begin(), options.methods.end(), MapMethod::grad_rollout) != options.methods.end()) {
    method["grad_rollout"] = {{"class", maps.target},
                              {"label", model.class_names.at(maps.target)},
                              {"class_source", maps.class_source},
                              {"score", "logit (before softmax)"},
                              {"discard_ratio", options.discard_ratio},
                              {"definition", kGradRolloutDefinition}};
  }
  return method;
}

// Step 5 (--faithfulness): each method's deletion, insertion and perturbation curves and a random order's, for
// summary.json.
nlohmann::ordered_json measure_faithfulness(LoadedModel& model, const torch::Tensor& input, const ImageMaps& maps,
                                            const AttentionExportOptions& options) {
  const ModelConfig config = model.config();
  const int64_t patches = config.grid_h() * config.grid_w();
  nlohmann::ordered_json curves = nlohmann::ordered_json::object();
  for (size_t m = 0; m < maps.methods.size(); ++m) {
    curves[maps.methods[m]->key] =
        faithfulness_of(model.net, input, importance_order(maps.maps[m]), maps.target, options.faithfulness_steps)
            .json();
  }
  const auto random = faithfulness_of(model.net, input, random_order(patches, options.random_seed), maps.target,
                                      options.faithfulness_steps);
  curves["random"] = random.json();
  // The levels are the same for every order.
  const auto& even = random.deletion.fractions;
  const auto& tenths = random.positive.fractions;
  return {
      {"class", maps.target},
      {"label", model.class_names.at(maps.target)},
      {"class_source", maps.class_source},
      {"baseline", "blanked patches are 0 after normalisation (the dataset mean colour); insertion starts from an "
                   "all-blank image"},
      {"random_seed", options.random_seed},
      {"metrics",
       {{"deletion", {{"better", "lower"}, {"fractions", even},
                      {"definition", "probability of the class as patches are blanked, most relevant first; "
                                     "AUC over the blanked fraction 0..1"}}},
        {"insertion", {{"better", "higher"}, {"fractions", even},
                       {"definition", "probability of the class as patches are restored onto a blank image, most "
                                      "relevant first; AUC over the restored fraction 0..1"}}},
        {"positive", {{"better", "lower"}, {"fractions", tenths},
                      {"definition", "positive perturbation (Chefer et al. 2021): 0%, 10%, .., 90% of the patches "
                                     "blanked, most relevant first; AUC of the probability over 0..0.9"}}},
        {"negative", {{"better", "higher"}, {"fractions", tenths},
                      {"definition", "negative perturbation: the same levels, least relevant first"}}}}},
      {"curves", curves},
      {"note", "top1: 1 where the class is still the prediction at that level (the accuracy curve over a folder)"},
  };
}

}  // namespace

AttentionExportResult export_image_attention(LoadedModel& model, const std::string& image_path,
                                             const cv::Mat& image_bgr, const torch::Tensor& input,
                                             const std::string& out_dir, const std::string& dir_name,
                                             const AttentionExportOptions& options) {
  const ModelConfig& config = model.config();
  check_attention_options(config, options, model.path);
  TORCH_CHECK(input.dim() == 3 && input.size(1) == config.img_h && input.size(2) == config.img_w,
              "export_image_attention: input has shape ", input.sizes(), ", expected (", config.in_chans, ", ",
              config.img_h, ", ", config.img_w, ")");
  const std::string dir = out_dir + "/" + dir_name;
  make_dirs(dir);

  AttentionExportResult result;
  result.dir_name = dir_name;
  result.layers = options.layers.empty() ? parse_index_list("all", config.depth, "--layers") : options.layers;
  result.heads = options.heads.empty() ? parse_index_list("all", config.num_heads, "--heads") : options.heads;
  result.view = model_view(image_bgr.rows, image_bgr.cols, model.preprocess, config.img_h, config.img_w);

  const ImageMaps maps = compute_maps(model, input, options, result);
  FileRoles files;
  if (options.write_npy) write_arrays(dir, maps, result, files);
  if (options.write_png) draw_overlays(dir, image_bgr, config, maps, result, options, files);

  const int64_t prefix = config.num_prefix_tokens();
  nlohmann::ordered_json summary = {
      {"format", kAttentionExportFormat},
      {"format_version", kAttentionExportVersion},
      {"image", image_path},
      {"image_size", {{"height", image_bgr.rows}, {"width", image_bgr.cols}}},
      {"model_view",
       {{"note", "the window of the image the model sees (crop_pct < 1: the centre crop); maps cover only it"},
        {"top", result.view.top * image_bgr.rows},
        {"left", result.view.left * image_bgr.cols},
        {"height", (result.view.bottom - result.view.top) * image_bgr.rows},
        {"width", (result.view.right - result.view.left) * image_bgr.cols}}},
      {"checkpoint", model.path},
      {"model",
       {{"img_size", {config.img_h, config.img_w}},
        {"patch_size", config.patch_size},
        {"grid", {config.grid_h(), config.grid_w()}},
        {"tokens", prefix + config.grid_h() * config.grid_w()},
        {"prefix_tokens", prefix},
        {"depth", config.depth},
        {"num_heads", config.num_heads}}},
      {"prediction", {{"class", maps.predicted}, {"label", model.class_names.at(maps.predicted)}, {"topk", maps.topk}}},
      {"method", describe_method(model, maps, result, options)},
  };
  files.add("summary", "summary.json");
  if (options.faithfulness) {
    summary["faithfulness"] = measure_faithfulness(model, input, maps, options);
    if (options.write_png) {
      write_faithfulness_plot(dir + "/faithfulness.png", summary["faithfulness"]);
      files.add("faithfulness_png", "faithfulness.png");
    }
  }
  summary["files"] = files.files;

  write_file_atomic(dir + "/summary.json", dump_json(summary));
  result.summary = std::move(summary);
  return result;
}

}  // namespace vit
