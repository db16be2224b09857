// Analytic multiply-accumulate counts of the ViT forward pass, layer by layer.
#include "model/flops.h"
#include "util/text.h"

namespace vit {

std::vector<LayerCost> layer_costs(const ModelConfig& m, int64_t input_h, int64_t input_w) {
  const int64_t trained_patches = m.grid_h() * m.grid_w();  // the position embedding's rows (its parameters)
  const int64_t patches = input_h > 0 && input_w > 0 ? (input_h / m.patch_size) * (input_w / m.patch_size)
                                                     : trained_patches;
  const int64_t N = patches + m.num_prefix_tokens();
  const int64_t D = m.embed_dim;
  const int64_t hidden = static_cast<int64_t>(static_cast<double>(D) * m.mlp_ratio);
  const int64_t P = m.patch_size;
  const auto shape = size_text;
  std::vector<LayerCost> costs;
  costs.push_back({"patch_embed.proj", shape(patches, D), D * m.in_chans * P * P + (m.pre_norm ? 0 : D), patches * D * m.in_chans * P * P});
  costs.push_back({"pos_embed", shape(N, D), (trained_patches + m.pos_embed_prefix()) * D + m.num_prefix_tokens() * D, 0});
  if (m.pre_norm) costs.push_back({"norm_pre", shape(N, D), 2 * D, 0});
  for (int64_t b = 0; b < m.depth; ++b) {
    const std::string prefix = "blocks." + std::to_string(b) + ".";
    costs.push_back({prefix + "norm1", shape(N, D), 2 * D, 0});
    costs.push_back({prefix + "attn.qkv", shape(N, 3 * D), 3 * D * D + (m.qkv_bias ? 3 * D : 0), N * D * 3 * D});
    if (m.qk_norm) costs.push_back({prefix + "attn.q_norm+k_norm", shape(N, 2 * D), 4 * m.head_dim(), 0});
    // q @ k^T and probs @ v: nh * N * N * hd each = N * N * D.
    costs.push_back({prefix + "attn.matmuls", shape(m.num_heads, N * N), 0, 2 * N * N * D});
    if (m.rel_pos_bias) {
      const int64_t entries = (2 * m.grid_h() - 1) * (2 * m.grid_w() - 1) + (m.num_prefix_tokens() > 0 ? 3 : 0);
      costs.push_back({prefix + "attn.relative_position_bias", shape(m.num_heads, N * N), entries * m.num_heads, 0});
    }
    costs.push_back({prefix + "attn.proj", shape(N, D), D * D + D, N * D * D});
    costs.push_back({prefix + "norm2", shape(N, D), 2 * D, 0});
    costs.push_back({prefix + "mlp.fc1", shape(N, hidden), D * hidden + hidden, N * D * hidden});
    costs.push_back({prefix + "mlp.fc2", shape(N, D), hidden * D + D, N * hidden * D});
    if (m.init_values) costs.push_back({prefix + "ls1+ls2", shape(N, D), 2 * D, 0});
  }
  if (m.final_norm && !m.use_fc_norm()) costs.push_back({"norm", shape(N, D), 2 * D, 0});
  if (m.global_pool == GlobalPool::map) {
    const int64_t Np = patches;
    costs.push_back({"attn_pool.latent+q", shape(1, D), D + D * D + D, D * D});
    costs.push_back({"attn_pool.kv", shape(Np, 2 * D), 2 * D * D + 2 * D, Np * D * 2 * D});
    costs.push_back({"attn_pool.matmuls", shape(m.num_heads, Np), 0, 2 * Np * D});
    costs.push_back({"attn_pool.proj", shape(1, D), D * D + D, D * D});
    costs.push_back({"attn_pool.norm", shape(1, D), 2 * D, 0});
    costs.push_back({"attn_pool.mlp", shape(1, D), 2 * D * hidden + hidden + D, 2 * D * hidden});
  }
  if (m.final_norm && m.use_fc_norm()) costs.push_back({"fc_norm", shape(1, D), 2 * D, 0});
  if (m.num_classes > 0) costs.push_back({"head", shape(1, m.num_classes), D * m.num_classes + m.num_classes, D * m.num_classes});
  return costs;
}

int64_t forward_macs(const ModelConfig& model, int64_t input_h, int64_t input_w) {
  int64_t total = 0;
  for (const auto& c : layer_costs(model, input_h, input_w)) total += c.macs;
  return total;
}

}  // namespace vit
