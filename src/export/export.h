// `vit export`: a model out to the tools a team deploys with: our own file, a timm or Hugging Face snapshot folder,
// or one ONNX file. What the target cannot represent fails before anything is written; nothing partial is left.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/enum_names.h"
#include "io/model_file.h"
#include "vit/build_config.h"
#if VIT_WITH_ONNX
#include "export/onnx_writer.h"
#endif

namespace vit {

enum class ExportFormat { vit, timm, hf, onnx };
VIT_ENUM_NAMES(ExportFormat, "vit", "timm", "hf", "onnx");

struct ExportRequest {
  ExportFormat format = ExportFormat::vit;
  std::string out;         // a file (vit, onnx) or a folder that must not exist yet (timm, hf)
  bool attention = false;  // onnx: each block's attention probabilities as outputs attention.{i}
  bool dynamic_size = false;   // onnx: symbolic height and width, the position embedding resampled in the graph
  bool external_data = false;  // onnx: the weights in <out>.data beside the graph (chosen anyway above 2 GiB)
  uint64_t max_shard_bytes = 0;  // timm, hf: weights above this split into shards with an index (0: one file)
  Precision precision = Precision::fp32;  // vit: fp32 or int8 weights (io/model_file.h); the others write float32
};

// --max-shard-size as transformers spells it: bytes, or a number with KB/MB/GB (powers of 1000) or KiB/MiB/GiB
// (powers of 1024), e.g. "5GB", "500MiB". Throws std::invalid_argument naming the text.
uint64_t parse_shard_size(const std::string& text);

// Writes `model` as asked. Throws std::invalid_argument for what the format cannot represent (naming it) and
// std::runtime_error for I/O failures (naming the path); either way `out` is left as it was. Returns what it wrote:
// `out`, and for ONNX with external data also its weights file.
std::vector<std::string> export_model(LoadedModel& model, const ExportRequest& request);

#if VIT_WITH_ONNX
// What the ONNX writer needs of a model: its config and every tensor as float32 (plus each block's relative
// position bias at the trained grid, from the model's own index rule).
onnx::ExportInput onnx_export_input(VisionTransformer& net, bool attention_outputs);
#endif

// True when this build can write ONNX (built with protobuf and Debian's ONNX schema).
bool onnx_export_available();

}  // namespace vit
