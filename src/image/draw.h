// Pictures the tool writes: training curves, confusion matrices, colormapped heatmaps and overlays (OpenCV).
#pragma once

#include <string>
#include <vector>

#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <torch/types.h>

#include "data/image.h"
#include "util/curves.h"

namespace vit {

// curves.png: panels side by side (500x420 each), each with axes, epochs 1..N on x and a legend.
void plot_curves(const std::string& path, const std::vector<CurvePanel>& panels);

// confusion.png: row-normalised confusion matrix (rows = true class) with class names and counts.
void plot_confusion(const std::string& path, const torch::Tensor& confusion, const std::vector<std::string>& names);

// Colormaps for heatmaps: "jet", "viridis", "inferno", "turbo" (others throw naming the allowed set).
void check_colormap(const std::string& name);
// A [0, 1] float heatmap (H, W) to an 8-bit BGR image through the colormap.
cv::Mat colorize(const cv::Mat& heat01, const std::string& colormap);
// Blends a colorized heatmap, resized to the image's size, over the image: alpha * heat + (1-alpha) * image.
// The float heatmap is upsampled (bicubic, or `interpolation`) to at most kHeatWorkingSide pixels on the long side
// and the colorized 8-bit map stretched from there (bilinear), so a 6000x4000 photo needs no full-size float buffer.
inline constexpr int kHeatWorkingSide = 1024;
cv::Mat overlay_heatmap(const cv::Mat& image_bgr, const cv::Mat& heat01, const std::string& colormap, double alpha,
                        int interpolation = cv::INTER_CUBIC);
// The 256 colours of a colormap as "#rrggbb" strings, index = 8-bit heat value (for the HTML gallery).
std::vector<std::string> colormap_table(const std::string& colormap);
// The image shrunk (area averaging) so its long side is at most max_side; smaller images are returned as they are.
cv::Mat fit_within(const cv::Mat& image, int max_side);
// Draws text with a light halo so it stays readable on any background; origin = baseline start as cv::putText.
void put_label(cv::Mat& canvas, const std::string& text, cv::Point origin, double scale, const cv::Scalar& color);

// RawImage (RGB/gray/RGBA) <-> OpenCV BGR images.
cv::Mat to_bgr(const RawImage& image);

// Writes an image with cv::imwrite through a temporary file; throws naming the path on failure.
void write_image(const std::string& path, const cv::Mat& image);

}  // namespace vit
