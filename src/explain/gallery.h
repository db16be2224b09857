// DIR/index.html for `vit export-attention`: one self-contained page (inline CSS, JS and data; no network) that
// shows every image with its prediction, overlays and the layer x head grid (clicking a cell enlarges that map), and,
// when faithfulness was measured, a sortable table of the methods at the top.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "explain/attention_export.h"

namespace vit {

struct GalleryError {
  std::string image;    // the input path
  std::string message;  // the same message predict prints
};

// The page's HTML. run: what the header shows (checkpoint, model, method); images link to the files each export
// wrote, relative to the page, so the page works when opened straight from disk. faithfulness: the folder's
// faithfulness_overview() (attention_export_run.h), shown as a sortable table at the top; null for none.
std::string gallery_html(const std::vector<AttentionExportResult>& results, const std::vector<GalleryError>& errors,
                         const nlohmann::ordered_json& run, const std::string& colormap, double alpha,
                         const nlohmann::ordered_json& faithfulness = nullptr);

// Writes out_dir/index.html atomically.
void write_gallery(const std::string& out_dir, const std::vector<AttentionExportResult>& results,
                   const std::vector<GalleryError>& errors, const nlohmann::ordered_json& run,
                   const std::string& colormap, double alpha, const nlohmann::ordered_json& faithfulness = nullptr);

}  // namespace vit
