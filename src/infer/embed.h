// Features of image files for use outside vit (retrieval, linear probes, clustering): the head's pooled pre-logits
// features, or the outputs of chosen blocks, one row per image with its predicted class, as .npy files and index.csv.
// Images are decoded through the shared inputs path (infer/inputs.h), so the rows are exactly what predict classifies.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "config/enum_names.h"
#include "data/image.h"
#include "io/model_file.h"

namespace vit {

// How a block's (or the final) tokens (B, N, D) become an image's features: the class token (B, D), the mean of the
// patch tokens, prefix tokens (class token, registers) excluded (B, D), or every token (B, N, D).
enum class EmbedPool { cls, avg, none };
VIT_ENUM_NAMES(EmbedPool, "cls", "avg", "none");

struct EmbedOptions {
  // Blocks whose outputs are written, 0-based as timm's forward_intermediates (block outputs, before the final
  // norm), in the order given; empty: the pooled features of the whole model.
  std::vector<int64_t> layers;
  // Pooling. Unset: the head's own pooling and fc_norm (forward_head's pre-logits) without layers, else
  // default_block_pool(). Set without layers: applied to forward_features' tokens (after the final norm).
  std::optional<EmbedPool> pool;
  int64_t batch_size = 16;  // images per forward pass
  ImageLimits limits;       // per input file: larger files and images are refused undecoded
};

// One input image, in input order.
struct EmbeddedImage {
  std::string path;
  std::string error;       // why it has no row (names the path); "" when it has one
  int64_t row = -1;        // its row in every output; -1 when it failed
  int64_t predicted = -1;  // top-1 class of this pass (no eval_hflip mirror); -1 when it failed or has no head
  bool ok() const { return error.empty(); }
};

struct Embeddings {
  std::vector<EmbeddedImage> images;  // every input, in order
  // File stem and rows, float32 on the CPU: "features", or "block_<i>" per layer in the order given. Each is
  // (rows, D), or (rows, N, D) with EmbedPool::none; undefined when no image had a row.
  std::vector<std::pair<std::string, torch::Tensor>> outputs;
  int64_t rows() const;
};

// Called once per batch, in order, with its images (the failed ones too).
using EmbedSink = std::function<void(const std::vector<EmbeddedImage>& batch)>;

// "3,7,11" -> block indices of a model of `depth` blocks; negative ones count from the end as in timm (-1 = the
// last block) and are returned resolved (0-based). Throws std::invalid_argument naming `option` and the bad item:
// not an integer, out of range (with the valid range), or a block listed twice.
std::vector<int64_t> parse_block_indices(const std::string& text, int64_t depth,
                                         const std::string& option = "--layers");
// The pooling of block outputs when none is asked for: the class token where the head reads it (class_token and
// global_pool token), else the patch mean.
EmbedPool default_block_pool(const ModelConfig& model);
// Throws std::invalid_argument (naming `model_name`) for options the model cannot serve: a layer out of range,
// EmbedPool::cls without a class token, a non-positive batch size.
void check_embed_options(const ModelConfig& model, const EmbedOptions& options, const std::string& model_name);

// The stems of embed's outputs in order: "features", or "block_<i>" per layer in the order given.
std::vector<std::string> embedding_output_names(const EmbedOptions& options);

// One batch's features (options' layers and pool; its batch size and limits unused).
struct EmbeddedBatch {
  std::vector<torch::Tensor> outputs;  // per embedding_output_names entry: (b, D) or (b, N, D), float32 on the CPU
  torch::Tensor predicted;             // (b) int64 top-1 class on the CPU; undefined when the model has no head
};
// `input` (b, C, H, W) on the model's device through `net` (in eval and inference mode), as embed_images does it
// for each of its batches. options must have passed check_embed_options.
EmbeddedBatch embed_batch(VisionTransformer& net, const torch::Tensor& input, const EmbedOptions& options);

// The features of `paths` (e.g. from expand_image_inputs), batch by batch, with `model` on its device in eval mode;
// inference mode, the next batch decoded while the current one runs on a GPU. An image that fails to decode gets its
// error and no row, never a throw. All rows are held in memory until the end.
Embeddings embed_images(LoadedModel& model, const std::vector<std::string>& paths, const EmbedOptions& options,
                        const EmbedSink& on_batch = nullptr);

// index.csv: "row,path,predicted", one line per image with a row (paths quoted as CSV needs); predicted is the class
// name, "" without a head.
std::string embedding_index_csv(const Embeddings& embeddings, const std::vector<std::string>& class_names);
// Creates out_dir and writes each output as out_dir/<stem>.npy, then out_dir/index.csv, each atomically. Throws
// std::runtime_error when no image has a row (nothing is written then).
void write_embeddings(const Embeddings& embeddings, const std::vector<std::string>& class_names,
                      const std::string& out_dir);

// `vit embed`: embed_images, then write_embeddings to out_dir. Returns the embeddings (their images say which
// failed).
Embeddings embed_to_dir(LoadedModel& model, const std::vector<std::string>& paths, const std::string& out_dir,
                        const EmbedOptions& options, const EmbedSink& on_batch = nullptr);

}  // namespace vit
