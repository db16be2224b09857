// Training curves, confusion matrices and heatmap overlays drawn with OpenCV.
#include "image/draw.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "util/fs.h"

namespace vit {
namespace {

const cv::Scalar kBlack(30, 30, 30), kGrid(225, 225, 225), kWhite(255, 255, 255);
const cv::Scalar kBlue(200, 110, 30), kOrange(20, 130, 240), kGreen(60, 160, 60), kPurple(160, 60, 140);
const cv::Scalar kRed(50, 50, 200), kGrey(140, 140, 140);

// Line colours in order: the first curve of a panel is blue, then orange, green, purple, red, grey (and round again).
const cv::Scalar kCurveColors[] = {kBlue, kOrange, kGreen, kPurple, kRed, kGrey};
constexpr size_t kCurveColorCount = sizeof(kCurveColors) / sizeof(kCurveColors[0]);

std::string format_tick(double v) {
  char text[32];
  if (std::fabs(v) >= 100) {
    std::snprintf(text, sizeof text, "%.0f", v);
  } else if (std::fabs(v) >= 10) {
    std::snprintf(text, sizeof text, "%.1f", v);
  } else {
    std::snprintf(text, sizeof text, "%.3g", v);
  }
  return text;
}

// One chart panel: axes, grid, ticks, series as lines with dots, a legend.
void draw_panel(cv::Mat& canvas, cv::Rect area, const CurvePanel& panel, const std::vector<cv::Scalar>& colors,
                int64_t epochs) {
  const std::string& title = panel.title;
  const std::vector<Curve>& series = panel.curves;
  const int left = area.x + 60, right = area.x + area.width - 20, top = area.y + 40, bottom = area.y + area.height - 45;
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& s : series) {
    for (double v : s.values) {
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
    }
  }
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  if (hi - lo < 1e-9) hi = lo + 1;
  const double pad = 0.05 * (hi - lo);
  lo -= pad, hi += pad;
  // Without x coordinates, value i lies at epoch i + 1.
  const bool has_x = !panel.x.empty();
  const double x_lo = has_x ? panel.x.front() : 1.0;
  const double x_hi = has_x ? std::max(panel.x.back(), x_lo + 1e-9) : static_cast<double>(std::max<int64_t>(epochs, 2));
  auto px = [&](double x) { return left + static_cast<int>((x - x_lo) / (x_hi - x_lo) * (right - left)); };
  auto x_of = [&](size_t i) {
    return has_x ? panel.x.at(std::min(i, panel.x.size() - 1)) : static_cast<double>(i + 1);
  };
  auto py = [&](double v) { return bottom - static_cast<int>((v - lo) / (hi - lo) * (bottom - top)); };
  cv::putText(canvas, title, {area.x + 10, area.y + 25}, cv::FONT_HERSHEY_SIMPLEX, 0.6, kBlack, 1, cv::LINE_AA);
  for (int i = 0; i <= 4; ++i) {
    const double v = lo + (hi - lo) * i / 4.0;
    cv::line(canvas, {left, py(v)}, {right, py(v)}, kGrid, 1);
    cv::putText(canvas, format_tick(v), {area.x + 5, py(v) + 4}, cv::FONT_HERSHEY_SIMPLEX, 0.4, kBlack, 1, cv::LINE_AA);
  }
  if (has_x) {
    for (int i = 0; i <= 4; ++i) {
      const double v = x_lo + (x_hi - x_lo) * i / 4.0;
      cv::putText(canvas, format_tick(v), {px(v) - 8, bottom + 18}, cv::FONT_HERSHEY_SIMPLEX, 0.4, kBlack, 1,
                  cv::LINE_AA);
    }
  } else {
    const int64_t step = std::max<int64_t>(1, epochs / 10);
    for (int64_t e = 1; e <= epochs; e += step) {
      cv::putText(canvas, std::to_string(e), {px(static_cast<double>(e)) - 4, bottom + 18}, cv::FONT_HERSHEY_SIMPLEX,
                  0.4, kBlack, 1, cv::LINE_AA);
    }
  }
  cv::putText(canvas, panel.x_label, {(left + right) / 2 - 4 * static_cast<int>(panel.x_label.size()), bottom + 38},
              cv::FONT_HERSHEY_SIMPLEX, 0.45, kBlack, 1, cv::LINE_AA);
  cv::rectangle(canvas, {left, top}, {right, bottom}, kBlack, 1);
  int legend_y = panel.legend_below ? bottom - 8 - 18 * (static_cast<int>(series.size()) - 1) : top + 16;
  for (size_t c = 0; c < series.size(); ++c) {
    const Curve& s = series[c];
    const cv::Scalar& color = colors[c];
    cv::Point previous(-1, -1);
    for (size_t i = 0; i < s.values.size(); ++i) {
      if (!std::isfinite(s.values[i])) continue;
      cv::Point point(px(x_of(i)), py(s.values[i]));
      if (previous.x >= 0) cv::line(canvas, previous, point, color, 2, cv::LINE_AA);
      cv::circle(canvas, point, 3, color, cv::FILLED, cv::LINE_AA);
      previous = point;
    }
    cv::line(canvas, {right - 150, legend_y - 4}, {right - 125, legend_y - 4}, color, 2, cv::LINE_AA);
    cv::putText(canvas, s.name, {right - 118, legend_y}, cv::FONT_HERSHEY_SIMPLEX, 0.45, kBlack, 1, cv::LINE_AA);
    legend_y += 18;
  }
}

}  // namespace

void write_image(const std::string& path, const cv::Mat& image) {
  std::vector<uchar> bytes;
  const std::string extension = lower_extension(path);
  if (!cv::imencode(extension.empty() ? ".png" : extension, image, bytes)) {
    throw std::runtime_error(path + ": cannot encode image");
  }
  write_file_atomic(path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

void plot_curves(const std::string& path, const std::vector<CurvePanel>& panels) {
  constexpr int kPanelWidth = 500, kHeight = 420;
  cv::Mat canvas(kHeight, kPanelWidth * std::max<int>(1, static_cast<int>(panels.size())), CV_8UC3, kWhite);
  int64_t epochs = 0;
  for (const auto& panel : panels) {
    for (const auto& curve : panel.curves) epochs = std::max<int64_t>(epochs, static_cast<int64_t>(curve.values.size()));
  }
  // Colours continue across panels, so every curve of the picture has its own.
  size_t next_color = 0;
  for (size_t p = 0; p < panels.size(); ++p) {
    std::vector<cv::Scalar> colors;
    for (size_t c = 0; c < panels[p].curves.size(); ++c) {
      colors.push_back(kCurveColors[next_color++ % kCurveColorCount]);
    }
    draw_panel(canvas, {static_cast<int>(p) * kPanelWidth, 0, kPanelWidth, kHeight}, panels[p], colors, epochs);
  }
  write_image(path, canvas);
}

void plot_confusion(const std::string& path, const torch::Tensor& confusion, const std::vector<std::string>& names) {
  const int K = static_cast<int>(confusion.size(0));
  const int cell = std::clamp(560 / std::max(K, 1), 6, 48);
  const int label_w = K <= 30 ? 140 : 10, margin_top = 40;
  cv::Mat canvas(margin_top + K * cell + 20, label_w + K * cell + 20, CV_8UC3, kWhite);
  auto counts = confusion.to(torch::kFloat64);
  auto row_sums = counts.sum(1, /*keepdim=*/true).clamp_min(1);
  auto fraction = (counts / row_sums).contiguous();
  auto acc = fraction.accessor<double, 2>();
  auto raw = counts.accessor<double, 2>();
  cv::putText(canvas, "confusion (rows: true class, columns: predicted)", {10, 25}, cv::FONT_HERSHEY_SIMPLEX, 0.5,
              kBlack, 1, cv::LINE_AA);
  for (int r = 0; r < K; ++r) {
    for (int c = 0; c < K; ++c) {
      const double f = acc[r][c];
      const int shade = 255 - static_cast<int>(f * 200);
      cv::Rect box(label_w + c * cell, margin_top + r * cell, cell, cell);
      cv::rectangle(canvas, box, cv::Scalar(255, shade, shade), cv::FILLED);
      cv::rectangle(canvas, box, kGrid, 1);
      if (cell >= 30) {
        const std::string text = std::to_string(static_cast<int64_t>(raw[r][c]));
        cv::putText(canvas, text, {box.x + 3, box.y + cell / 2 + 4}, cv::FONT_HERSHEY_SIMPLEX, 0.35,
                    f > 0.5 ? kWhite : kBlack, 1, cv::LINE_AA);
      }
    }
    if (K <= 30) {
      std::string name = r < static_cast<int>(names.size()) ? names[r] : std::to_string(r);
      if (name.size() > 18) name.replace(17, std::string::npos, "~");
      cv::putText(canvas, name, {5, margin_top + r * cell + cell / 2 + 4}, cv::FONT_HERSHEY_SIMPLEX, 0.4, kBlack, 1,
                  cv::LINE_AA);
    }
  }
  write_image(path, canvas);
}

void check_colormap(const std::string& name) {
  if (name != "jet" && name != "viridis" && name != "inferno" && name != "turbo") {
    throw std::invalid_argument("unknown colormap \"" + name + "\" (allowed: jet, viridis, inferno, turbo)");
  }
}

cv::Mat colorize(const cv::Mat& heat01, const std::string& colormap) {
  check_colormap(colormap);
  cv::Mat heat8;
  heat01.convertTo(heat8, CV_8U, 255.0);
  const int map = colormap == "jet"       ? cv::COLORMAP_JET
                  : colormap == "viridis" ? cv::COLORMAP_VIRIDIS
                  : colormap == "inferno" ? cv::COLORMAP_INFERNO
                                          : cv::COLORMAP_TURBO;
  cv::Mat colored;
  cv::applyColorMap(heat8, colored, map);
  return colored;
}

cv::Mat overlay_heatmap(const cv::Mat& image_bgr, const cv::Mat& heat01, const std::string& colormap, double alpha,
                        int interpolation) {
  const cv::Size full = image_bgr.size();
  const int long_side = std::max(full.width, full.height);
  cv::Size working = full;
  if (long_side > kHeatWorkingSide) {
    const double scale = static_cast<double>(kHeatWorkingSide) / long_side;
    working = cv::Size(std::max(1, static_cast<int>(std::lround(full.width * scale))),
                       std::max(1, static_cast<int>(std::lround(full.height * scale))));
  }
  cv::Mat heat;
  heat01.convertTo(heat, CV_32F);
  cv::Mat resized;
  cv::resize(heat, resized, working, 0, 0, interpolation);
  cv::min(cv::max(resized, 0.0), 1.0, resized);  // bicubic overshoots
  cv::Mat colored = colorize(resized, colormap);
  if (working != full) {
    cv::Mat stretched;
    const int stretch = interpolation == cv::INTER_NEAREST ? cv::INTER_NEAREST : cv::INTER_LINEAR;
    cv::resize(colored, stretched, full, 0, 0, stretch);
    colored = stretched;
  }
  cv::Mat blended;
  cv::addWeighted(colored, alpha, image_bgr, 1.0 - alpha, 0.0, blended);
  return blended;
}

std::vector<std::string> colormap_table(const std::string& colormap) {
  cv::Mat ramp(1, 256, CV_32F);
  for (int i = 0; i < 256; ++i) ramp.at<float>(0, i) = static_cast<float>(i) / 255.0f;
  const cv::Mat colored = colorize(ramp, colormap);  // (1, 256) BGR
  std::vector<std::string> table;
  for (int i = 0; i < 256; ++i) {
    const auto& bgr = colored.at<cv::Vec3b>(0, i);
    char hex[8];
    std::snprintf(hex, sizeof hex, "#%02x%02x%02x", bgr[2], bgr[1], bgr[0]);
    table.emplace_back(hex);
  }
  return table;
}

cv::Mat fit_within(const cv::Mat& image, int max_side) {
  const int long_side = std::max(image.cols, image.rows);
  if (long_side <= max_side) return image;
  const double scale = static_cast<double>(max_side) / long_side;
  cv::Mat small;
  cv::resize(image, small,
             cv::Size(std::max(1, static_cast<int>(std::lround(image.cols * scale))),
                      std::max(1, static_cast<int>(std::lround(image.rows * scale)))),
             0, 0, cv::INTER_AREA);
  return small;
}

void put_label(cv::Mat& canvas, const std::string& text, cv::Point origin, double scale, const cv::Scalar& color) {
  cv::putText(canvas, text, origin, cv::FONT_HERSHEY_SIMPLEX, scale, kWhite, 3, cv::LINE_AA);
  cv::putText(canvas, text, origin, cv::FONT_HERSHEY_SIMPLEX, scale, color, 1, cv::LINE_AA);
}

cv::Mat to_bgr(const RawImage& image) {
  cv::Mat wrapped(static_cast<int>(image.height), static_cast<int>(image.width),
                  CV_8UC(static_cast<int>(image.channels)), const_cast<uint8_t*>(image.pixels.data()));
  cv::Mat bgr;
  if (image.channels == 1) {
    cv::cvtColor(wrapped, bgr, cv::COLOR_GRAY2BGR);
  } else if (image.channels == 3) {
    cv::cvtColor(wrapped, bgr, cv::COLOR_RGB2BGR);
  } else if (image.channels == 4) {
    cv::cvtColor(wrapped, bgr, cv::COLOR_RGBA2BGR);
  } else {
    throw std::invalid_argument("cannot show an image with " + std::to_string(image.channels) + " channels");
  }
  return bgr;  // owns its pixels (cvtColor allocates)
}

}  // namespace vit
