// Hugging Face transformers DINOv3 folders (DINOv3ViTModel.save_pretrained, model_type "dinov3_vit"): config.json to
// timm's Eva options (DINOv3 rotary periods, registers, LayerScale, q_proj / k_proj / v_proj, the plain or gated MLP)
// and the tensor names of transformers' layout against timm's. Features only: DINOv3ViTModel has no classifier, its
// pooler output is the class token after the final norm.
#include <stdexcept>

#include "io/snapshot_json.h"
#include "util/fs.h"

namespace vit {
namespace snapshot_detail {

void read_hf_dinov3(const json& config, Snapshot& s) {
  const std::string file = s.dir + "/config.json";
  const json archs = config.value("architectures", json());
  if (archs.is_array()) {
    for (const auto& a : archs) {
      if (a != "DINOv3ViTModel" && a != "DINOv3ViTBackbone") {
        fail(file, "architectures: " + show(a) + " is not supported (vit reads DINOv3ViTModel's weights)");
      }
    }
  }
  ModelConfig& m = s.model;
  m = ModelConfig{};
  m.model_class = ModelClass::eva;
  m.num_classes = 0, m.class_token = true, m.global_pool = GlobalPool::token, m.fc_norm = false;
  m.use_abs_pos_emb = false, m.use_rot_pos_emb = true, m.rope_type = RopeType::dinov3, m.rope_rotate_half = true;
  m.qkv_fused = false, m.layer_norm_eps = 1e-5, m.rope_temperature = 100.0;
  m.embed_dim = 384, m.depth = 12, m.num_heads = 6;  // DINOv3ViTConfig's defaults where config.json says nothing
  // pos_embed_rescale's default: training-time only.
  m.rope_rescale_coords = 2.0;
  // DINOv3ViTConfig's keys that are our fields under another name.
  auto dinov3_key = [](const std::string& field) -> std::string {
    // clang-format off
    static const std::map<std::string, std::string> keys = {
        {"embed_dim", "hidden_size"},                {"depth", "num_hidden_layers"},
        {"num_heads", "num_attention_heads"},        {"in_chans", "num_channels"},
        {"layer_norm_eps", "layer_norm_eps"},        {"rope_temperature", "rope_theta"},
        {"reg_tokens", "num_register_tokens"},       {"rope_shift_coords", "pos_embed_shift"},
        {"rope_jitter_coords", "pos_embed_jitter"},  {"rope_rescale_coords", "pos_embed_rescale"}};
    // clang-format on
    const auto it = keys.find(field);
    return it == keys.end() ? "" : it->second;
  };
  read_fields(config, "", file, dinov3_key, m);
  // A square patch and an image size (one number or a pair).
  const json patch = config.value("patch_size", json(16));
  if (patch.is_number_integer()) {
    m.patch_size = patch.get<int64_t>();
  } else if (patch.is_array() && patch.size() == 2 && patch[0] == patch[1] && patch[0].is_number_integer()) {
    m.patch_size = patch[0].get<int64_t>();
  } else {
    fail(file, "patch_size: " + show(patch) + " is not one side or a square pair");
  }
  const json size = config.value("image_size", json(224));
  if (size.is_number_integer()) {
    m.img_h = m.img_w = size.get<int64_t>();
  } else if (size.is_array() && size.size() == 2 && size[0].is_number_integer() && size[1].is_number_integer()) {
    m.img_h = size[0].get<int64_t>(), m.img_w = size[1].get<int64_t>();
  } else {
    fail(file, "image_size: " + show(size) + " is not a number or an [H, W] pair");
  }
  m.init_values = get_or<double>(config, "layerscale_value", 1.0, file);
  // The query, key and value biases: DINOv3's (query and value, as timm's EvaAttention), all three (AttentionRope's) or
  // none.
  const bool query = get_or<bool>(config, "query_bias", true, file),
             key = get_or<bool>(config, "key_bias", false, file),
             value = get_or<bool>(config, "value_bias", true, file);
  if (query != value || (key && !query)) {
    fail(file, "query_bias " + std::string(query ? "true" : "false") + ", key_bias " + (key ? "true" : "false") +
                   ", value_bias " + (value ? "true" : "false") +
                   " is not supported (vit has query and value biases, all three or none)");
  }
  m.qkv_bias = query, m.attn_type = key ? AttnType::rope : AttnType::eva;
  m.proj_bias = get_or<bool>(config, "proj_bias", true, file);
  if (get_or<bool>(config, "mlp_bias", true, file) != m.proj_bias) {
    fail(file, "mlp_bias differs from proj_bias (vit has one proj_bias for the attention output and the MLP)");
  }
  const bool gated = get_or<bool>(config, "use_gated_mlp", false, file);
  const auto act = get_or<std::string>(config, "hidden_act", "gelu", file);
  if (act != (gated ? "silu" : "gelu")) {
    fail(file, "hidden_act \"" + act + "\" is not supported with use_gated_mlp " + (gated ? "true" : "false") +
                   " (vit has a GELU MLP, or SwiGLU: a SiLU gate)");
  }
  // The gated MLP is timm's SwiGLU with separate gate and value projections (align 1: the width as it is).
  m.swiglu_mlp = gated, m.swiglu_align_to = gated ? 1 : 0;
  const auto intermediate = get_or<int64_t>(config, "intermediate_size", 1536, file);
  m.mlp_ratio = static_cast<double>(intermediate) / static_cast<double>(m.embed_dim);
  if (m.mlp_hidden() != intermediate) {
    fail(file, "intermediate_size " + std::to_string(intermediate) + " is not a width vit can make from hidden_size");
  }
  s.sources.emplace_back("model", "config.json: Hugging Face DINOv3 (DINOv3ViTModel, features)");

  const std::string pre_file = s.dir + "/preprocessor_config.json";
  const json pre =
      file_exists(pre_file) ? read_json(pre_file) : json{{"image_processor_type", "DINOv3ViTImageProcessor"}};
  s.preprocess = read_hf_processor(pre, pre_file, m);
  s.sources.emplace_back("preprocess", file_exists(pre_file)
                                           ? "preprocessor_config.json: DINOv3ViTImageProcessor"
                                           : "DINOv3ViTImageProcessor's defaults (no preprocessor_config.json)");
}

std::map<std::string, std::vector<std::string>> dinov3_names(const ModelConfig& m,
                                                             const std::vector<std::string>& theirs,
                                                             const std::string& path) {
  // transformers' name (exact, or a prefix ending in '.') -> ours; inside "layer.N." the block's.
  static const std::vector<std::pair<std::string, std::string>> top = {
      {"embeddings.cls_token", "cls_token"},
      {"embeddings.register_tokens", "reg_token"},
      {"embeddings.patch_embeddings.", "patch_embed.proj."},
      {"norm.", "norm."}};
  const std::vector<std::pair<std::string, std::string>> block = {
      {"norm1.", "norm1."},
      {"attention.q_proj.", "attn.q_proj."},
      {"attention.k_proj.", "attn.k_proj."},
      {"attention.v_proj.", "attn.v_proj."},
      {"attention.o_proj.", "attn.proj."},
      {"layer_scale1.lambda1", "gamma_1"},
      {"norm2.", "norm2."},
      {"layer_scale2.lambda1", "gamma_2"},
      {"mlp.gate_proj.", "mlp.fc1_g."},
      {"mlp.up_proj.", m.swiglu_mlp ? "mlp.fc1_x." : "mlp.fc1."},
      {"mlp.down_proj.", "mlp.fc2."}};
  std::map<std::string, std::vector<std::string>> out;
  std::vector<std::string> unknown;
  for (const auto& name : theirs) {
    // save_pretrained writes the blocks as "layer.N." (the hub's files); the module tree has them under "model.".
    const std::string layer = name.rfind("model.layer.", 0) == 0 ? "model.layer." : "layer.";
    if (name == "embeddings.mask_token") continue;  // masked-image pretraining's token: inference never reads it
    // transformers keeps a (1, 0, D) register_tokens without registers; timm (and vit) have no reg_token then.
    if (name == "embeddings.register_tokens" && m.reg_tokens == 0) continue;
    std::string ours;
    for (const auto& [from, to] : top) {
      if (ours.empty()) ours = renamed(name, from, to);
    }
    if (ours.empty() && name.rfind(layer, 0) == 0) {
      const auto dot = name.find('.', layer.size());
      const std::string index = dot == std::string::npos ? "" : name.substr(layer.size(), dot - layer.size());
      for (const auto& [from, to] : block) {
        if (ours.empty() && !index.empty()) {
          const std::string rest = renamed(name.substr(dot + 1), from, to);
          if (!rest.empty()) ours = "blocks." + index + "." + rest;
        }
      }
    }
    if (ours.empty()) {
      unknown.push_back(name);
    } else {
      out[ours] = {name};
    }
  }
  if (!unknown.empty()) fail_unknown_tensors(path, "a Hugging Face DINOv3 ViT", unknown);
  return out;
}

}  // namespace snapshot_detail
}  // namespace vit
