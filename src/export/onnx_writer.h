// Writes a Vision Transformer as one ONNX file (opset 17) from its architecture and weights. Torch-free and
// protobuf-free in this header: the writer links the system protobuf, which a LibTorch's own headers would clash with.
//
// The graph: input `pixel_values` (batch, C, H, W) float32, H x W the trained size; output `logits` (batch, K), or
// `features` (batch, D), the pooled and normalised features, for a model without a head (num_classes 0); with
// attention_outputs also `attention.{i}` (batch, nh, N, N), block i's softmax probabilities (rows = queries), and with
// global_pool "map" `pool_attention` (batch, nh, 1, Np), the pooling head's.
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
  // export/export.h's onnx_export_input).
  std::map<std::string, Weight> weights;
  std::vector<std::pair<std::string, std::string>> metadata;   // -> ModelProto.metadata_props, in order
  bool attention_outputs = false;                              // also output each block's attention probabilities
};

// Writes `path` atomically (temp file in the same folder, then rename; nothing left behind on failure).
// Throws std::runtime_error "<path>: <what>" naming any feature, weight or metadata key that cannot be represented.
void write_onnx(const ExportInput& input, const std::string& path);

}  // namespace vit::onnx
