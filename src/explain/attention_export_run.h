// `vit export-attention` over many images: each decoded through the shared inputs path (infer/inputs.h) and exported
// into its own folder; an image that fails gets an error entry instead of stopping the run. Vision library (OpenCV).
#pragma once

#include <functional>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "explain/attention_export.h"
#include "explain/gallery.h"

namespace vit {

struct AttentionExportRun {
  std::vector<AttentionExportResult> results;  // the exported images, in input order
  std::vector<GalleryError> errors;   // the images that failed, in input order
};

// Told about each image once it is done: result is null when it failed (then error says why); seconds counts its
// decoding and export.
using AttentionExportProgress = std::function<void(const std::string& path, const AttentionExportResult* result,
                                                   const std::string& error, double seconds)>;

// Creates out_dir and exports every image of `paths` into out_dir/<unique stem>/ with export_image_attention(), one
// image at a time (only one full-size image is held). The model should be in eval mode with any head mask set.
// Does not write the gallery (write_gallery takes the returned results and errors).
AttentionExportRun export_attention_images(LoadedModel& model, const std::vector<std::string>& paths,
                                           const std::string& out_dir, const AttentionExportOptions& options,
                                           const AttentionExportProgress& on_image = nullptr);

// The folder's faithfulness, from the images whose summary has one (null when none does): per method and metric the
// mean curve, the mean AUC and the AUC of the accuracy curve (the share of images still predicting the explained
// class), and a table row per method: {method, deletion, insertion, positive, negative, positive_accuracy,
// negative_accuracy, deletion_beats_random (the share of images)}.
nlohmann::ordered_json faithfulness_overview(const std::vector<AttentionExportResult>& results);

// out_dir/summary.json: the run, the images and errors, and the overview when there is one; with write_png also
// out_dir/faithfulness.png (the mean curves), whose name is then added to the overview as "plot".
void write_attention_summary(const std::string& out_dir, const nlohmann::ordered_json& run,
                             const AttentionExportRun& exported, nlohmann::ordered_json& faithfulness, bool write_png);

// `vit export-attention` whole: the options checked against the model (check_attention_options) before the first
// image, every image exported (export_attention_images, `on_image` told), then out_dir/summary.json (with the run's
// description: checkpoint, model, methods, rollout, explained class, `masked_heads` as given, images) and the
// gallery, out_dir/index.html.
AttentionExportRun run_attention_export(LoadedModel& model, const std::vector<std::string>& paths,
                                        const std::string& out_dir, const AttentionExportOptions& options,
                                        const std::string& masked_heads, const AttentionExportProgress& on_image);

}  // namespace vit
