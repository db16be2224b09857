// `vit export`: a model (our file or a timm / Hugging Face snapshot folder) to our file, timm, HF or ONNX.
#include "commands.h"
#include "common.h"
#include "export/export.h"
#include "util/log.h"

namespace vit::app {
namespace {

struct ExportOptions {
  std::string checkpoint;
  ConfigArgs config;
  std::string format;
  std::string img_size;  // --img-size: the exported model's own input size (default: the model's)
  std::string max_shard_size;  // --max-shard-size: "" for one weights file
  std::string precision;       // --precision: "" = the model's own for --format vit (int8 stays int8), else fp32
  ExportRequest request;
};

int run_export(const ExportOptions& options) {
  ExportRequest request = options.request;
  request.format = *enum_from_name<ExportFormat>(options.format);  // the option's check admits only the names
  if (!options.max_shard_size.empty()) request.max_shard_bytes = parse_shard_size(options.max_shard_size);
  auto model = load_model_args(options.checkpoint, options.config, options.img_size);
  request.precision = !options.precision.empty()               ? *enum_from_name<Precision>(options.precision)
                      : request.format == ExportFormat::vit ? model.precision
                                                            : Precision::fp32;
  if (model.precision == Precision::int8 && request.precision == Precision::fp32) {
    log::info(model.path + " holds int8 weights: written dequantized, in float32");
  }
  const auto written = export_model(model, request);
  std::string files;
  for (const auto& file : written) files += (files.empty() ? "" : " and ") + file;
  log::info("wrote " + files + " (" + options.format + ") from " + model.path);
  return kOk;
}

}  // namespace

void setup_export(CLI::App& app, int& status) {
  auto options = std::make_shared<ExportOptions>();
  auto* command = app.add_subcommand("export", "Write a model as our file, a timm or Hugging Face snapshot, or ONNX");
  command->add_option("--checkpoint", options->checkpoint, kCheckpointHelp)
      ->check(CLI::ExistingPath);
  add_config_args(command, options->config);
  command->add_option("--format", options->format, "vit | timm | hf | onnx")->required()->check(enum_choice<ExportFormat>());
  command->add_option("--out", options->request.out, "output file (vit, onnx) or new folder (timm, hf)")->required();
  command->add_option("--img-size", options->img_size,
                      "write the model at this input size: N or HxW, each side a multiple of the patch (default: its "
                      "own); the position embedding is resampled once, as timm's checkpoint filter does");
  command->add_option("--precision", options->precision,
                      "vit: fp32 or int8 (the linear layers and the patch embedding in int8 with a float32 scale per "
                      "output row: ~0.26x the size; default: the model's own)")
      ->check(CLI::IsMember({"fp32", "int8"}));
  command->add_option("--max-shard-size", options->max_shard_size,
                      "timm, hf: weights larger than this are written as shards with model.safetensors.index.json, "
                      "as transformers' save_pretrained writes them (e.g. 5GB, 500MiB; default: one file)");
  command->add_flag("--attention", options->request.attention,
                    "onnx: also output each block's attention probabilities (attention.0, ...)");
  command->add_flag("--dynamic-size", options->request.dynamic_size,
                    "onnx: any input height and width (multiples of the patch), the position embedding resampled "
                    "inside the graph as timm's dynamic_img_size does (opset 18)");
  command->add_flag("--external-data", options->request.external_data,
                    "onnx: the weights in <out>.data beside the graph (ONNX external data); chosen anyway for "
                    "weights over 2 GiB");
  command->callback([options, &status] { status = run_export(*options); });
}

}  // namespace vit::app
