// Image files to model inputs, decoded in parallel with an error per image.
#include "infer/inputs.h"

#include <algorithm>
#include <future>
#include <stdexcept>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "data/image.h"
#include "image/decode.h"
#include "image/draw.h"

namespace vit {

std::vector<PreparedImage> prepare_images(const std::vector<std::string>& paths, const Preprocess& preprocess,
                                          const ModelConfig& model, const ImageLimits& limits, bool keep_bgr) {
  std::vector<PreparedImage> images(paths.size());
  const Normalizer normalizer(preprocess, model.in_chans);
  at::parallel_for(0, static_cast<int64_t>(paths.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      PreparedImage& image = images[i];
      image.path = paths[i];
      try {
        // The RawImage dies at the end of this block: of a large photo only the BGR copy (if kept) stays alive.
        const RawImage raw = decode_image(image.path, limits);
        image.input = vit::preprocess(raw, preprocess, normalizer, model.img_h, model.img_w);
        if (keep_bgr) image.image_bgr = to_bgr(raw);
      } catch (const std::exception& e) {
        image.input = torch::Tensor();
        image.image_bgr = cv::Mat();
        image.error = e.what();
        if (image.error.empty()) image.error = "could not be decoded";
      }
    }
  });
  return images;
}

void for_each_prepared_batch(const std::vector<std::string>& paths, size_t batch_size, const Preprocess& preprocess,
                             const ModelConfig& model, const ImageLimits& limits, bool overlap,
                             const std::function<void(const std::vector<PreparedImage>& batch)>& on_batch) {
  if (batch_size == 0) throw std::invalid_argument("for_each_prepared_batch: batch size must be positive");
  auto prepare = [&](size_t start) {
    const std::vector<std::string> chunk(paths.begin() + start,
                                         paths.begin() + std::min(paths.size(), start + batch_size));
    return prepare_images(chunk, preprocess, model, limits);
  };
  std::future<std::vector<PreparedImage>> next;
  if (overlap && !paths.empty()) next = std::async(std::launch::async, prepare, 0);
  for (size_t start = 0; start < paths.size(); start += batch_size) {
    const std::vector<PreparedImage> images = overlap ? next.get() : prepare(start);
    if (overlap && start + batch_size < paths.size()) {
      next = std::async(std::launch::async, prepare, start + batch_size);
    }
    on_batch(images);
  }
}

torch::Tensor stack_inputs(const std::vector<PreparedImage>& images) {
  std::vector<torch::Tensor> rows;
  for (const auto& image : images) {
    if (image.ok()) rows.push_back(image.input);
  }
  return rows.empty() ? torch::Tensor() : torch::stack(rows);
}

}  // namespace vit
