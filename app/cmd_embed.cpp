// `vit embed`: image features (pooled pre-logits or chosen blocks' outputs) as .npy files plus index.csv
// (src/infer/embed.h), for retrieval, linear probes or clustering outside vit.
#include <string>
#include <vector>

#include "commands.h"
#include "common.h"
#include "infer/embed.h"  // declarations only: the pooling names are needed without OpenCV too
#include "util/fs.h"
#include "util/log.h"
#include "util/progress.h"
#include "util/runtime.h"
#include "vit/build_config.h"

namespace vit::app {
namespace {

struct EmbedCommandOptions {
  ImageModelArgs image_model;
  std::string out;       // DIR
  std::string layers;    // "3,7,11" (default: the pooled pre-logits features)
  std::string pool;      // cls | avg | none (default: see --help)
  int batch_size = 16;
};

#if VIT_WITH_OPENCV
// "(120, 64)": a tensor's shape for the log.
std::string shape_text(const torch::Tensor& tensor) {
  std::string text = "(";
  for (int64_t d = 0; d < tensor.dim(); ++d) {
    if (d > 0) text += ", ";
    text += std::to_string(tensor.size(d));
  }
  return text + ")";
}

int run_embed(const EmbedCommandOptions& o) {
  auto model = load_image_model(o.image_model);
  EmbedOptions options;
  if (!o.layers.empty()) options.layers = parse_block_indices(o.layers, model.config().depth, "--layers");
  if (!o.pool.empty()) options.pool = enum_from_name<EmbedPool>(o.pool);
  options.batch_size = o.batch_size;
  options.limits = o.image_model.limits;
  check_embed_options(model.config(), options, model.path);  // before any image is read
  const auto files = start_image_run(model, o.image_model);

  ProgressOptions shown;
  shown.show = files.size() > static_cast<size_t>(o.batch_size);  // one batch is over before a bar would help
  Progress progress(static_cast<int64_t>(files.size()), "embed", "img", shown);
  int failures = 0;
  auto report = [&](const std::vector<EmbeddedImage>& batch) {
    for (const auto& image : batch) {
      if (image.ok()) continue;
      ++failures;
      progress.clear();  // the error takes the bar's line
      log::error(image.error);
    }
    progress.advance(static_cast<int64_t>(batch.size()));
  };
  const Embeddings embeddings = embed_to_dir(model, files, o.out, options, report);
  progress.finish();

  std::string written;
  for (const auto& [stem, rows] : embeddings.outputs) {
    written += o.out + "/" + stem + ".npy " + shape_text(rows) + ", ";
  }
  log::info("wrote " + written + o.out + "/index.csv (" + std::to_string(embeddings.rows()) + " rows)");
  if (failures > 0) {
    log::error(std::to_string(failures) + " of " + std::to_string(files.size()) + " images could not be embedded");
  }
  return inputs_status(failures, files.size());
}
#else
int run_embed(const EmbedCommandOptions&) { needs_opencv("embed"); }
#endif

}  // namespace

void setup_embed(CLI::App& app, int& status) {
  auto options = std::make_shared<EmbedCommandOptions>();
  auto* command = app.add_subcommand(
      "embed",
      "Write image features (files or folders, searched recursively) as .npy arrays plus index.csv");
  command->footer(
      "Output, in DIR:\n"
      "  features.npy   (images, D): the head's pooled pre-logits features, as timm's\n"
      "                 forward_head(forward_features(x), pre_logits=True): class token, patch mean or MAP\n"
      "                 pooling, then fc_norm. With --pool: that pooling of forward_features' tokens (after\n"
      "                 the final norm) instead.\n"
      "  block_<i>.npy  with --layers, one per block: its output tokens as timm's forward_intermediates\n"
      "                 (before the final norm), pooled by --pool: cls (images, D), avg (images, D) or\n"
      "                 none (images, tokens, D). <i> is the block's 0-based index, also when given from the end.\n"
      "  index.csv      row,path,predicted: the npy row of each image that was read (in the order predict\n"
      "                 lists them) and its predicted class.\n"
      "An image that cannot be read is logged and gets no row; the others are still written (exit status 3).");
  add_image_model_args(command, options->image_model);
  command->add_option("--out", options->out, "output directory (created): the .npy files and index.csv")->required();
  command->add_option("--layers", options->layers,
                      "blocks whose outputs to write instead of the pooled features: i,j,... 0-based, e.g. 3,7,11; "
                      "negative counts from the end (-1 = the last block)");
  command->add_option("--pool", options->pool,
                      "tokens to a row: cls (the class token), avg (mean of the patch tokens, class and register "
                      "tokens excluded), none (every token). Default: with --layers cls where the model's head "
                      "reads its class token, else avg; without --layers the head's own pooling")
      ->check(enum_choice<EmbedPool>());
  command->add_option("--batch-size", options->batch_size, "images per forward pass")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->callback([options, &status] { status = run_embed(*options); });
}

}  // namespace vit::app
