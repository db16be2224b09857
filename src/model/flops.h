// Analytic cost of a forward pass: multiply-accumulates per layer (matmuls and convolutions; norms, softmax and
// activations are ignored, as fvcore/timm count), used by `vit info` and `vit bench`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/model_config.h"

namespace vit {

struct LayerCost {
  std::string name;    // timm module name, e.g. "blocks.0.attn.qkv"
  std::string output;  // output shape per image, e.g. "197x2304"
  int64_t params = 0;
  int64_t macs = 0;    // per image
};

// Per-layer costs for one image at the model's own size (grid_h x grid_w), or at input_h x input_w (another grid,
// as timm's dynamic_img_size runs it: outputs and MACs at that size, parameters those of the model as built).
// training: the forward as training runs it, on the patch tokens patch_drop_rate keeps after the position embedding.
std::vector<LayerCost> layer_costs(const ModelConfig& model, int64_t input_h = 0, int64_t input_w = 0,
                                   bool training = false);
// Sum of layer_costs' MACs; a training step costs about 3x the forward FLOPs of training's forward (forward + 2x
// backward).
int64_t forward_macs(const ModelConfig& model, int64_t input_h = 0, int64_t input_w = 0, bool training = false);

}  // namespace vit
