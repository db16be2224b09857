// Writes the export-attention gallery: a static page whose inline script draws the layer x head maps from inline
// data (canvas, one pixel per patch) and shows overlays written next to it, so it opens from disk with no network.
// The page itself is src/explain/gallery/page.{html,css,js}, embedded at build time (CMakeLists.txt).
#include "explain/gallery.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "explain/gallery_page.h"
#include "image/draw.h"
#include "util/fs.h"

namespace vit {
namespace {

// Percent-encodes one path segment for a relative URL (names may hold spaces, '#', '%', non-ASCII bytes).
std::string url_segment(const std::string& name) {
  std::string out;
  for (const unsigned char c : name) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char escaped[4];
      std::snprintf(escaped, sizeof escaped, "%%%02X", c);
      out += escaped;
    }
  }
  return out;
}

// Maps rounded to 4 decimals: plenty for 256 colours, and it keeps the page small.
nlohmann::ordered_json maps_json(const AttentionExportResult& result) {
  const auto maps = result.head_maps.to(torch::kFloat64).contiguous();  // (layers, heads, gh, gw)
  const auto on = result.head_on.accessor<bool, 2>();
  nlohmann::ordered_json layers = nlohmann::ordered_json::array(), flags = nlohmann::ordered_json::array();
  for (int64_t r = 0; r < maps.size(0); ++r) {
    nlohmann::ordered_json row = nlohmann::ordered_json::array(), row_on = nlohmann::ordered_json::array();
    for (int64_t c = 0; c < maps.size(1); ++c) {
      const auto flat = maps[r][c].reshape(-1).contiguous();
      const double* values = flat.data_ptr<double>();
      std::vector<double> rounded(flat.numel());
      for (int64_t i = 0; i < flat.numel(); ++i) rounded[i] = std::round(values[i] * 1e4) / 1e4;
      row.push_back(rounded);
      row_on.push_back(on[r][c]);
    }
    layers.push_back(row);
    flags.push_back(row_on);
  }
  return {{"maps", layers}, {"on", flags}};
}

nlohmann::ordered_json image_json(const AttentionExportResult& result) {
  const auto& summary = result.summary;
  auto maps = maps_json(result);
  nlohmann::ordered_json image = {
      {"name", result.dir_name},
      {"dir", url_segment(result.dir_name)},
      {"image", summary.at("image")},
      {"size", {summary.at("image_size").at("height"), summary.at("image_size").at("width")}},
      {"grid", summary.at("model").at("grid")},
      {"view", {result.view.top, result.view.left, result.view.bottom, result.view.right}},
      {"prediction", summary.at("prediction")},
      {"files", summary.at("files")},
      {"layers", result.layers},
      {"heads", result.heads},
      {"maps", maps["maps"]},
      {"on", maps["on"]},
      {"method", summary.at("method")},
  };
  if (summary.contains("faithfulness")) {
    auto faithfulness = summary.at("faithfulness");
    for (auto& [key, curves] : faithfulness["curves"].items()) {
      for (auto& [metric, curve] : curves.items()) curve.erase("top1");  // the page draws probabilities only
    }
    image["faithfulness"] = faithfulness;
  }
  return image;
}



}  // namespace

std::string gallery_html(const std::vector<AttentionExportResult>& results, const std::vector<GalleryError>& errors,
                         const nlohmann::ordered_json& run, const std::string& colormap, double alpha,
                         const nlohmann::ordered_json& faithfulness) {
  nlohmann::ordered_json data = {{"run", run}, {"colormap", colormap_table(colormap)}, {"alpha", alpha}};
  if (!faithfulness.is_null()) {
    // The page needs the table and the plot's name, not the folder's mean curves.
    data["faithfulness"] = {{"images", faithfulness.at("images")}, {"table", faithfulness.at("table")}};
    if (faithfulness.contains("plot")) data["faithfulness"]["plot"] = faithfulness.at("plot");
  }
  data["images"] = nlohmann::ordered_json::array();
  for (const auto& result : results) data["images"].push_back(image_json(result));
  data["errors"] = nlohmann::ordered_json::array();
  for (const auto& error : errors) data["errors"].push_back({{"image", error.image}, {"message", error.message}});
  // '<' only occurs inside JSON strings, where \u003c means the same: the data can never close its <script>.
  std::string json = data.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  std::string escaped;
  escaped.reserve(json.size());
  for (const char c : json) {
    if (c == '<') escaped += "\\u003c";
    else escaped += c;
  }
  // The page with {{style}}, {{data}} and {{script}} filled in, each once and in that order, so nothing inserted is
  // ever read as a placeholder.
  const std::string page = gallery_page::k_page_html;
  std::string out;
  size_t at = 0;
  for (const auto& [placeholder, value] : {std::pair<const char*, std::string>{"{{style}}", gallery_page::k_page_css},
                                          {"{{data}}", escaped},
                                          {"{{script}}", gallery_page::k_page_js}}) {
    const size_t found = page.find(placeholder, at);
    if (found == std::string::npos) throw std::logic_error(std::string("gallery page: no ") + placeholder);
    out.append(page, at, found - at);
    out += value;
    at = found + std::strlen(placeholder);
  }
  return out.append(page, at);
}

void write_gallery(const std::string& out_dir, const std::vector<AttentionExportResult>& results,
                   const std::vector<GalleryError>& errors, const nlohmann::ordered_json& run,
                   const std::string& colormap, double alpha, const nlohmann::ordered_json& faithfulness) {
  write_file_atomic(out_dir + "/index.html", gallery_html(results, errors, run, colormap, alpha, faithfulness));
}

}  // namespace vit
