// The model's own configuration: what a Vision Transformer is built from, and all the model layer sees of the config.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "config/enum_names.h"

namespace vit {

// What the head reads: the class token, or the mean of the patch tokens (then through fc_norm).
enum class GlobalPool { token, avg };
VIT_ENUM_NAMES(GlobalPool, "token", "avg");

// Architecture of a Vision Transformer; field names equal timm's constructor arguments.
struct ModelConfig {
  std::string preset;            // optional preset name that filled the defaults ("" = none)
  int64_t img_h = 224;           // input height the position embedding was trained for
  int64_t img_w = 224;           // input width
  int64_t patch_size = 16;       // square patch side (kernel = stride of the patch embedding)
  int64_t in_chans = 3;          // input channels (1 = grayscale, 3 = RGB, more allowed)
  int64_t num_classes = 1000;    // classifier outputs (0 = no head, features only)
  int64_t embed_dim = 768;       // C: token width
  int64_t depth = 12;            // number of transformer blocks
  int64_t num_heads = 12;        // nh: attention heads; must divide embed_dim
  double mlp_ratio = 4.0;        // MLP hidden width = embed_dim * mlp_ratio
  bool qkv_bias = true;          // bias on the fused qkv projection
  bool class_token = true;       // prepend a learned class token
  GlobalPool global_pool = GlobalPool::token;  // token: the class token; avg: mean of patch tokens, with fc_norm
  double drop_rate = 0.0;        // dropout before the head
  double attn_drop_rate = 0.0;   // dropout on attention probabilities
  double proj_drop_rate = 0.0;   // dropout after attention/MLP projections
  double drop_path_rate = 0.0;   // stochastic depth, linear from 0 to this over the blocks
  std::optional<double> init_values;  // LayerScale initial value (absent = no LayerScale)
  double layer_norm_eps = 1e-6;  // LayerNorm epsilon (timm's ViT uses 1e-6)
  bool rel_pos_bias = false;     // learned 2-D relative position bias per head (added to attention logits)

  int64_t grid_h() const { return img_h / patch_size; }
  int64_t grid_w() const { return img_w / patch_size; }
  int64_t head_dim() const { return embed_dim / num_heads; }
};

// Names of the presets (vit_tiny_patch16_224, ...).
std::vector<std::string> preset_names();
// The preset's model config; throws naming the unknown preset and the known ones.
ModelConfig model_preset(const std::string& name);

// The "model" section (`source` names the file in errors), and back.
ModelConfig parse_model_config(const nlohmann::json& section, const std::string& source);
nlohmann::json to_json(const ModelConfig& model);

// Throws std::invalid_argument with the reason when the model config is inconsistent.
void validate(const ModelConfig& model, const std::string& source);

}  // namespace vit
