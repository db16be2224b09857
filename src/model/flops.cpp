// Analytic multiply-accumulate counts of the ViT forward pass, layer by layer.
#include "model/flops.h"

namespace vit {

std::vector<LayerCost> layer_costs(const ModelConfig& m) {
  const int64_t patches = m.grid_h() * m.grid_w();
  const int64_t N = patches + (m.class_token ? 1 : 0);
  const int64_t D = m.embed_dim;
  const int64_t hidden = static_cast<int64_t>(static_cast<double>(D) * m.mlp_ratio);
  const int64_t P = m.patch_size;
  auto shape = [](int64_t a, int64_t b) { return std::to_string(a) + "x" + std::to_string(b); };
  std::vector<LayerCost> costs;
  costs.push_back({"patch_embed.proj", shape(patches, D), D * m.in_chans * P * P + D, patches * D * m.in_chans * P * P});
  costs.push_back({"pos_embed", shape(N, D), N * D + (m.class_token ? D : 0), 0});
  for (int64_t b = 0; b < m.depth; ++b) {
    const std::string prefix = "blocks." + std::to_string(b) + ".";
    costs.push_back({prefix + "norm1", shape(N, D), 2 * D, 0});
    costs.push_back({prefix + "attn.qkv", shape(N, 3 * D), 3 * D * D + (m.qkv_bias ? 3 * D : 0), N * D * 3 * D});
    // q @ k^T and probs @ v: nh * N * N * hd each = N * N * D.
    costs.push_back({prefix + "attn.matmuls", shape(m.num_heads, N * N), 0, 2 * N * N * D});
    costs.push_back({prefix + "attn.proj", shape(N, D), D * D + D, N * D * D});
    costs.push_back({prefix + "norm2", shape(N, D), 2 * D, 0});
    costs.push_back({prefix + "mlp.fc1", shape(N, hidden), D * hidden + hidden, N * D * hidden});
    costs.push_back({prefix + "mlp.fc2", shape(N, D), hidden * D + D, N * hidden * D});
  }
  const bool avg = m.global_pool == GlobalPool::avg;
  costs.push_back({avg ? "fc_norm" : "norm", shape(avg ? 1 : N, D), 2 * D, 0});
  if (m.num_classes > 0) costs.push_back({"head", shape(1, m.num_classes), D * m.num_classes + m.num_classes, D * m.num_classes});
  return costs;
}

int64_t forward_macs(const ModelConfig& model) {
  int64_t total = 0;
  for (const auto& c : layer_costs(model)) total += c.macs;
  return total;
}

}  // namespace vit
