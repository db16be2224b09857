// Analytic multiply-accumulate counts of the ViT forward pass, layer by layer.
#include "model/flops.h"
#include "util/text.h"

namespace vit {

std::vector<LayerCost> layer_costs(const ModelConfig& m, int64_t input_h, int64_t input_w, bool training) {
  const int64_t trained_patches = m.grid_h() * m.grid_w();  // the position embedding's rows (its parameters)
  const int64_t patches = input_h > 0 && input_w > 0 ? (input_h / m.patch_size) * (input_w / m.patch_size)
                                                     : trained_patches;
  const int64_t kept = training ? m.patches_kept_in_training(patches) : patches;  // the patch tokens the blocks see
  const int64_t N = kept + m.num_prefix_tokens();
  const int64_t D = m.embed_dim;
  const int64_t hidden = m.mlp_hidden();
  const int64_t P = m.patch_size;
  const auto shape = size_text;
  const int64_t norm = m.norm_layer == NormLayer::layernorm ? 2 : 1;  // a norm's parameters per feature
  const int64_t bias = m.proj_bias ? 1 : 0;                           // attn.proj's and the MLP's
  std::vector<LayerCost> costs;
  costs.push_back({"patch_embed.proj", shape(patches, D), D * m.in_chans * P * P + (m.pre_norm ? 0 : D), patches * D * m.in_chans * P * P});
  if (m.embed_norm_layer) {
    costs.push_back(
        {"patch_embed.norm", shape(patches, D), (*m.embed_norm_layer == NormLayer::layernorm ? 2 : 1) * D, 0});
  }
  const int64_t pos_rows = m.use_abs_pos_emb ? trained_patches + m.pos_embed_prefix() : 0;
  costs.push_back(
      {"pos_embed", shape(patches + m.num_prefix_tokens(), D), pos_rows * D + m.num_prefix_tokens() * D, 0});
  if (m.use_rot_pos_emb && m.rope_type == RopeType::mixed) {
    costs.push_back({"rope.freqs", shape(m.num_heads, patches), 2 * m.depth * m.num_heads * (m.head_dim() / 2), 0});
  }
  if (m.pre_norm) costs.push_back({"norm_pre", shape(N, D), norm * D, 0});
  for (int64_t b = 0; b < m.depth; ++b) {
    const std::string prefix = "blocks." + std::to_string(b) + ".";
    costs.push_back({prefix + "norm1", shape(N, D), norm * D, 0});
    // Eva's q_bias and v_bias, or an unfused k_proj of EvaAttention, hold no key bias.
    const bool no_key_bias =
        m.eva_qkv_bias() || (!m.qkv_fused && m.model_class == ModelClass::eva && m.attn_type == AttnType::eva);
    const int64_t kv = m.kv_heads(b) * m.head_dim();  // k's and v's width (D, or less with grouped-query attention)
    const int64_t qkv = D + 2 * kv;
    costs.push_back(
        {prefix + "attn.qkv", shape(N, qkv), qkv * D + (m.qkv_bias ? (no_key_bias ? D + kv : qkv) : 0), N * D * qkv});
    if (m.qk_norm) costs.push_back({prefix + "attn.q_norm+k_norm", shape(N, 2 * D), 2 * norm * m.head_dim(), 0});
    // q @ k^T and probs @ v: nh * N * N * hd each = N * N * D.
    costs.push_back({prefix + "attn.matmuls", shape(m.num_heads, N * N), 0, 2 * N * N * D});
    if (m.rel_pos_bias) {
      const int64_t entries = (2 * m.grid_h() - 1) * (2 * m.grid_w() - 1) + (m.num_prefix_tokens() > 0 ? 3 : 0);
      costs.push_back({prefix + "attn.relative_position_bias", shape(m.num_heads, N * N), entries * m.num_heads, 0});
    }
    if (m.scale_attn_inner) costs.push_back({prefix + "attn.norm", shape(N, D), norm * D, 0});
    costs.push_back({prefix + "attn.proj", shape(N, D), D * D + bias * D, N * D * D});
    costs.push_back({prefix + "norm2", shape(N, D), norm * D, 0});
    const int64_t fc1_rows = m.gated_mlp() ? 2 * hidden : hidden;  // SwiGLU: gate and value
    costs.push_back({prefix + (m.swiglu_split() ? "mlp.fc1_g+fc1_x" : "mlp.fc1"), shape(N, fc1_rows),
                     D * fc1_rows + bias * fc1_rows, N * D * fc1_rows});
    if (m.scale_mlp) costs.push_back({prefix + "mlp.norm", shape(N, hidden), norm * hidden, 0});
    costs.push_back({prefix + "mlp.fc2", shape(N, D), hidden * D + bias * D, N * hidden * D});
    if (m.init_values) {
      const bool one = m.model_class == ModelClass::eva && m.attn_only_layer_scale;
      costs.push_back({prefix + (one ? "gamma_1" : "ls1+ls2"), shape(N, D), (one ? 1 : 2) * D, 0});
    }
  }
  if (m.final_norm && !m.use_fc_norm()) costs.push_back({"norm", shape(N, D), norm * D, 0});
  if (m.global_pool == GlobalPool::map) {
    const int64_t Np = kept + (m.pool_includes_prefix() ? m.num_prefix_tokens() : 0);  // the tokens it attends
    costs.push_back({"attn_pool.latent+q", shape(1, D), D + D * D + D, D * D});
    costs.push_back({"attn_pool.kv", shape(Np, 2 * D), 2 * D * D + 2 * D, Np * D * 2 * D});
    costs.push_back({"attn_pool.matmuls", shape(m.pool_heads(), Np), 0, 2 * Np * D});
    costs.push_back({"attn_pool.proj", shape(1, D), D * D + D, D * D});
    costs.push_back({"attn_pool.norm", shape(1, D), norm * D, 0});
    const int64_t pool_hidden = m.pool_hidden();
    costs.push_back({"attn_pool.mlp", shape(1, D), 2 * D * pool_hidden + pool_hidden + D, 2 * D * pool_hidden});
  }
  if (m.final_norm && m.use_fc_norm()) costs.push_back({"fc_norm", shape(1, D), norm * D, 0});
  if (m.num_classes > 0) costs.push_back({"head", shape(1, m.num_classes), D * m.num_classes + m.num_classes, D * m.num_classes});
  return costs;
}

int64_t forward_macs(const ModelConfig& model, int64_t input_h, int64_t input_w, bool training) {
  int64_t total = 0;
  for (const auto& c : layer_costs(model, input_h, input_w, training)) total += c.macs;
  return total;
}

}  // namespace vit
