// Image files to model inputs: the one place that decodes command-line images (predict, export-attention) through the
// shared preprocessing, in parallel, with an error per image instead of an abort. Vision library (OpenCV).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include <opencv2/core.hpp>
#include <torch/types.h>

#include "config/config.h"
#include "data/image.h"

namespace vit {

struct PreparedImage {
  std::string path;
  torch::Tensor input;  // (C, H, W) float32 at the model's size; undefined when the image failed
  std::string error;    // why it failed (names the path); "" when it was prepared
  cv::Mat image_bgr;    // the decoded image at its own resolution, 8-bit BGR; only with keep_bgr
  bool ok() const { return input.defined(); }
};

// Decodes `paths` and preprocesses them for `model` (its size and channels) with `preprocess`, one image per task
// across libtorch's intra-op threads (each image's resize then runs on its own thread). A file that is missing,
// unreadable, not a regular file, over `limits` or not a decodable image gets its error; the others are still prepared.
// Results are in `paths` order. keep_bgr: also keep each image's BGR copy (for overlays); costs the memory of every
// full-size image.
std::vector<PreparedImage> prepare_images(const std::vector<std::string>& paths, const Preprocess& preprocess,
                                          const ModelConfig& model, const ImageLimits& limits, bool keep_bgr = false);

// Prepares `paths` batch_size at a time (prepare_images) and hands each batch, in order, to `on_batch`: the loop of
// predict and embed. With overlap (a model on a GPU) the CPU decodes the next batch while on_batch runs the current
// one; without it decoding and the model take all the cores in turn (a decoding thread beside the model's threads
// would only make both wait).
void for_each_prepared_batch(const std::vector<std::string>& paths, size_t batch_size, const Preprocess& preprocess,
                             const ModelConfig& model, const ImageLimits& limits, bool overlap,
                             const std::function<void(const std::vector<PreparedImage>& batch)>& on_batch);

// The inputs of the prepared images stacked in order, (B, C, H, W); undefined when none was prepared.
torch::Tensor stack_inputs(const std::vector<PreparedImage>& images);

}  // namespace vit
