// Rules over the model's parameter names (timm's state-dict names, defined by model/vit.cpp): which parameters take
// no weight decay, which layer a parameter belongs to, and which parameters a name prefix selects. Training applies
// them (train/optimizer.h); they live here, beside the names, so a new parameter is classified where it is named.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

namespace vit {

// True for parameters that get no weight decay: biases, norm weights and LayerScale (every tensor of one dimension
// or less), and timm's VisionTransformer.no_weight_decay(): pos_embed, cls_token, reg_token (and the relative bias
// table).
bool no_weight_decay(const std::string& name, const at::Tensor& parameter);

// The layer of a ViT parameter: 0 for patch_embed, cls_token, reg_token, pos_embed and norm_pre, i + 1 for blocks.i,
// depth + 1 for the rest (final norm, fc_norm, attn_pool, head), as BEiT and timm number them. Throws for a block
// index at or past `depth`.
int64_t layer_of(const std::string& name, int64_t depth);

// Whether `prefix` selects the parameter: it matches whole dotted components ("blocks.1" is blocks.1 and blocks.1.*,
// never blocks.10), and "backbone" selects all but head.*.
bool parameter_in(const std::string& name, const std::string& prefix);

}  // namespace vit
