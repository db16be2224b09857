// Writes a Vision Transformer as one ONNX file (opset 17) from its architecture and weights. Torch-free and
// protobuf-free in this header: the writer links the system protobuf, which a LibTorch's own headers would clash with.
//
// The graph: input `pixel_values` (batch, C, H, W) float32, H x W the trained size (or symbolic `height` x `width`
// with dynamic_size: any multiple of the patch, the position embedding resampled and a rotary table computed inside
// the graph as timm's dynamic_img_size does; opset 18); output `logits` (batch, K), or
// `features` (batch, D), the pooled and normalised features, for a model without a head (num_classes 0); with
// attention_outputs also `attention.{i}` (batch, nh, N, N), block i's softmax probabilities (rows = queries), and with
// global_pool "map" `pool_attention` (batch, pool heads, 1, Np or N), the pooling head's.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "config/model_config.h"

namespace vit::onnx {

struct Weight {
  std::vector<int64_t> shape;
  std::vector<float> data;  // row-major, product(shape) values
};

struct ExportInput {
  ModelConfig model;                                           // the resolved architecture
  // Every parameter and buffer, by (timm) state-dict name; with model.rel_pos_bias also, per block, the bias the
  // model adds at its trained grid, "blocks.{i}.attn.relative_position_bias" (nh, N, N) (the model computes it:
  // export/export.h's onnx_export_input); with model.use_rot_pos_emb "rope.table", the rotary table at the trained
  // grid (model/rope.h's RotaryEmbedding::embed), and but for rope_type mixed "rope.frequencies" (its frequencies(),
  // from which a dynamic size's graph computes the table for each input).
  std::map<std::string, Weight> weights;
  std::vector<std::pair<std::string, std::string>> metadata;   // -> ModelProto.metadata_props, in order
  bool attention_outputs = false;                              // also output each block's attention probabilities
  bool dynamic_size = false;  // symbolic height and width; refused for rel_pos_bias (its bias is per grid)
  // The weights in external_data_path(path) beside the graph, as ONNX's external data (offsets 4096-aligned, tensors
  // under 1 KiB stay inline). Chosen unasked when the weights would pass protobuf's 2 GiB limit (ViT-H/14 and up).
  bool external_data = false;
};

// The external data file of `path`: "model.onnx" -> "model.onnx.data", as torch.onnx names it.
std::string external_data_path(const std::string& path);
// True when weights of this many bytes cannot stay inside one ONNX protobuf (2 GiB less room for the graph).
bool needs_external_data(uint64_t weight_bytes);

// Writes `path` atomically (temp file in the same folder, then rename; nothing left behind on failure), with its
// external data file (when asked for, or needed) renamed into place just before it. Returns the files written: `path`,
// then the external data file if there is one.
// Throws std::runtime_error "<path>: <what>" naming any feature, weight or metadata key that cannot be represented.
std::vector<std::string> write_onnx(const ExportInput& input, const std::string& path);

}  // namespace vit::onnx
