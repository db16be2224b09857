// Image features batch by batch: the head's pre-logits or chosen blocks' outputs, pooled, accumulated on the CPU.
#include "infer/embed.h"

#include <algorithm>
#include <stdexcept>

#include <torch/torch.h>

#include "infer/inputs.h"
#include "io/npy.h"
#include "util/fs.h"

namespace vit {
namespace {

// tokens (B, N, D) -> (B, D) or, with none, (B, N, D); prefix: the class and register tokens before the patches.
torch::Tensor pool_tokens(const torch::Tensor& tokens, EmbedPool pool, int64_t prefix) {
  switch (pool) {
    case EmbedPool::cls: return tokens.select(1, 0);
    case EmbedPool::avg: return tokens.narrow(1, prefix, tokens.size(1) - prefix).mean(1);
    case EmbedPool::none: return tokens;
  }
  throw std::invalid_argument("embed: unknown pooling");
}

// A CSV field as RFC 4180 wants it: quoted (quotes doubled) when it holds a comma, a quote or a line break.
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (const char c : text) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  quoted += '"';
  return quoted;
}

std::string block_range(int64_t depth) {
  std::string text = "valid are 0..";
  text += std::to_string(depth - 1);
  text += " (or -";
  text += std::to_string(depth);
  text += "..-1 from the end)";
  return text;
}

}  // namespace

int64_t Embeddings::rows() const {
  return std::count_if(images.begin(), images.end(), [](const EmbeddedImage& image) { return image.ok(); });
}

std::vector<int64_t> parse_block_indices(const std::string& text, int64_t depth, const std::string& option) {
  std::vector<int64_t> out;
  std::vector<std::string> spellings;  // as given, to name both spellings of a block listed twice
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, comma - begin);
    begin = comma + 1;
    int64_t value = 0;
    try {
      size_t used = 0;
      value = std::stoll(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw std::invalid_argument(option + ": \"" + item + "\" is not a block index (expected i,j,..., e.g. 3,7,11)");
    }
    if (value < -depth || value >= depth) {
      throw std::invalid_argument(option + ": block " + item + " is out of range: the model has " +
                                  std::to_string(depth) + " blocks, " + block_range(depth));
    }
    const int64_t block = value < 0 ? depth + value : value;
    const auto seen = std::find(out.begin(), out.end(), block);
    if (seen != out.end()) {
      throw std::invalid_argument(option + ": block " + std::to_string(block) + " is listed twice (" +
                                  spellings[seen - out.begin()] + " and " + item + ")");
    }
    out.push_back(block);
    spellings.push_back(item);
  }
  return out;
}

EmbedPool default_block_pool(const ModelConfig& model) {
  return model.class_token && model.global_pool == GlobalPool::token ? EmbedPool::cls : EmbedPool::avg;
}

void check_embed_options(const ModelConfig& model, const EmbedOptions& options, const std::string& model_name) {
  if (options.batch_size <= 0) {
    throw std::invalid_argument(std::string("embed: batch size ") + std::to_string(options.batch_size) +
                                " must be positive");
  }
  for (const int64_t layer : options.layers) {
    if (layer < 0 || layer >= model.depth) {
      throw std::invalid_argument(std::string("embed: block ") + std::to_string(layer) + " is out of range for " +
                                  model_name + " (" + std::to_string(model.depth) + " blocks, " +
                                  block_range(model.depth) + ")");
    }
  }
  // Only an explicit cls can miss the class token: the default pools never read one the model lacks.
  if (options.pool == EmbedPool::cls && !model.class_token) {
    throw std::invalid_argument("--pool cls: " + model_name +
                                " has no class token (class_token false); use avg or none");
  }
}

std::vector<std::string> embedding_output_names(const EmbedOptions& options) {
  if (options.layers.empty()) return {"features"};
  std::vector<std::string> names;
  for (const int64_t layer : options.layers) names.push_back(std::string("block_") + std::to_string(layer));
  return names;
}

EmbeddedBatch embed_batch(VisionTransformer& net, const torch::Tensor& input, const EmbedOptions& options) {
  const int64_t prefix = net->num_prefix_tokens();
  const EmbedPool block_pool = options.pool.value_or(default_block_pool(net->config()));
  Capture capture;
  capture.block_outputs = !options.layers.empty();
  const auto tokens = net->forward_features(input, {}, capture.block_outputs ? &capture : nullptr);  // (b, N, D)
  const auto pooled = net->forward_head(tokens, /*pre_logits=*/true);                               // (b, D)
  EmbeddedBatch out;
  if (options.layers.empty()) {
    out.outputs.push_back(options.pool ? pool_tokens(tokens, *options.pool, prefix) : pooled);
  } else {
    for (const int64_t layer : options.layers) {
      out.outputs.push_back(pool_tokens(capture.outputs[layer], block_pool, prefix));
    }
  }
  for (auto& rows : out.outputs) rows = rows.to(torch::kCPU, torch::kFloat32).contiguous();
  if (net->head) out.predicted = net->head->forward(pooled).argmax(-1).to(torch::kCPU).contiguous();
  return out;
}

Embeddings embed_images(LoadedModel& model, const std::vector<std::string>& paths, const EmbedOptions& options,
                        const EmbedSink& on_batch) {
  check_embed_options(model.config(), options, model.path);
  VisionTransformer& net = model.net;
  const torch::Device device = net->parameters().front().device();

  Embeddings result;
  for (auto& name : embedding_output_names(options)) result.outputs.emplace_back(std::move(name), torch::Tensor());
  std::vector<std::vector<torch::Tensor>> chunks(result.outputs.size());  // per output, per batch: (b, ...) rows
  int64_t rows = 0;

  c10::InferenceMode inference;
  for_each_prepared_batch(
      paths, static_cast<size_t>(options.batch_size), model.preprocess, model.config(), options.limits,
      /*overlap=*/device.is_cuda(),
      [&](const std::vector<PreparedImage>& images) {
        std::vector<EmbeddedImage> batch(images.size());
        for (size_t i = 0; i < images.size(); ++i) {
          batch[i].path = images[i].path;
          batch[i].error = images[i].error;
        }
        torch::Tensor input = stack_inputs(images);  // (b, C, H, W): the images that decoded
        if (input.defined()) {
          if (device.is_cuda()) input = input.pin_memory().to(device, /*non_blocking=*/true);
          EmbeddedBatch features = embed_batch(net, input, options);
          for (size_t k = 0; k < features.outputs.size(); ++k) chunks[k].push_back(std::move(features.outputs[k]));
          int64_t row = 0;
          for (size_t i = 0; i < images.size(); ++i) {
            if (!images[i].ok()) continue;
            batch[i].row = rows + row;
            if (features.predicted.defined()) batch[i].predicted = features.predicted[row].item<int64_t>();
            ++row;
          }
          rows += row;
        }
        result.images.insert(result.images.end(), batch.begin(), batch.end());
        if (on_batch) on_batch(batch);
      });
  for (size_t k = 0; k < chunks.size(); ++k) {
    if (!chunks[k].empty()) result.outputs[k].second = torch::cat(chunks[k]);
  }
  return result;
}

std::string embedding_index_csv(const Embeddings& embeddings, const std::vector<std::string>& class_names) {
  std::string csv = "row,path,predicted\n";
  for (const auto& image : embeddings.images) {
    if (!image.ok()) continue;
    csv += std::to_string(image.row);
    csv += ',';
    csv += csv_field(image.path);
    csv += ',';
    if (image.predicted >= 0 && image.predicted < static_cast<int64_t>(class_names.size())) {
      csv += csv_field(class_names[image.predicted]);
    }
    csv += '\n';
  }
  return csv;
}

void write_embeddings(const Embeddings& embeddings, const std::vector<std::string>& class_names,
                      const std::string& out_dir) {
  if (embeddings.rows() == 0) {
    throw std::runtime_error(std::string("none of the ") + std::to_string(embeddings.images.size()) +
                             " images could be decoded: nothing written to " + out_dir);
  }
  make_dirs(out_dir);
  for (const auto& [stem, rows] : embeddings.outputs) write_npy(out_dir + "/" + stem + ".npy", rows);
  write_file_atomic(out_dir + "/index.csv", embedding_index_csv(embeddings, class_names));
}

Embeddings embed_to_dir(LoadedModel& model, const std::vector<std::string>& paths, const std::string& out_dir,
                        const EmbedOptions& options, const EmbedSink& on_batch) {
  Embeddings embeddings = embed_images(model, paths, options, on_batch);
  write_embeddings(embeddings, model.class_names, out_dir);
  return embeddings;
}

}  // namespace vit
