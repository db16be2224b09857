// Rotary position embeddings over the patch grid (timm's Eva class, timm/layers/pos_embed_sincos.py): the sines and
// cosines that rotate each patch token's queries and keys by its position, computed for any grid as timm computes
// them with dynamic_img_size, so a model runs at every size divisible by its patch.
//
// Shape key: gh/gw patch grid, Np = gh*gw patches, hd head dim, nh heads, B batch, N tokens (prefix + Np).
#pragma once

#include <array>
#include <optional>

#include <torch/torch.h>

#include "config/model_config.h"

namespace vit {

struct RotaryEmbeddingImpl : torch::nn::Module {
  // Registered as the model's "rope" module; only rope_type mixed has a parameter (rope.freqs).
  explicit RotaryEmbeddingImpl(const ModelConfig& config);

  // sin and cos concatenated on the last axis for a gh x gw grid, patches in row-major order, float32:
  // (Np, 2 hd) for cat and dinov3, (depth, nh, Np, 2 hd) for mixed (one table per block and head). In training mode
  // the coordinates are augmented first, one draw per call (timm's _apply_coord_augs).
  torch::Tensor embed(std::array<int64_t, 2> grid) const;
  // The fixed frequencies embed multiplies the coordinates by, float32 (hd / 4): cat's bands 1 / T^(i / (hd/4)), or
  // dinov3's periods T^(2i / (hd/2)) that it divides 2 pi times the coordinates by. Undefined for mixed (freqs).
  torch::Tensor frequencies() const;
  // The coordinates (Np, 2) as embed uses them: augmented in training mode, else unchanged.
  torch::Tensor augment(const torch::Tensor& coords) const;
  // rope_type mixed: frequencies of timm's init_random_2d_freqs (a random rotation per block and head).
  void reset_parameters();

  torch::Tensor freqs;  // mixed: (2, depth, nh, hd / 2), x then y frequencies; undefined otherwise
  RopeType type;
  int64_t head_dim, depth, num_heads;
  double temperature, grid_offset;
  GridIndexing indexing;
  bool rotate_half;
  std::array<int64_t, 2> ref_feat;  // {0, 0}: none
  std::optional<double> shift_coords, jitter_coords, rescale_coords;  // training-time augmentations (model_config.h)
};
TORCH_MODULE(RotaryEmbedding);

// Rotates the tokens of x after the first `prefix` by `rope` (as embed gives it, broadcastable to x's patch rows):
// x (B, nh, N, hd) -> (B, nh, N, hd); the prefix tokens pass unchanged. rotate_half pairs channel i with i + hd/2,
// otherwise 2i with 2i + 1 (timm's apply_rot_embed_cat).
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& rope, int64_t prefix, bool rotate_half);

}  // namespace vit
