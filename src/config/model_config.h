// The model's own configuration: what a Vision Transformer is built from, and all the model layer sees of the config.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "config/enum_names.h"
#include "util/field_key.h"

namespace vit {

// What the head reads: the class token, the mean of the patch tokens, or an attention-pooling head over the patch
// tokens ("map": a learned latent query, timm's AttentionPoolLatent, as SigLIP).
enum class GlobalPool { token, avg, map };
VIT_ENUM_NAMES(GlobalPool, "token", "avg", "map");

// The MLP's activation (timm's act_layer): exact GELU (nn.GELU), CLIP's x * sigmoid(1.702 x), tanh-approximate GELU,
// or SiLU x * sigmoid(x) (the gate of AIMv2's and DINOv2 giant's SwiGLU).
enum class Activation { gelu, quick_gelu, gelu_tanh, silu };
VIT_ENUM_NAMES(Activation, "gelu", "quick_gelu", "gelu_tanh", "silu");

// timm's norm_layer, by get_norm_layer's names: LayerNorm (weight and bias) or RmsNorm (x / rms(x), weight only).
enum class NormLayer { layernorm, rmsnorm };
VIT_ENUM_NAMES(NormLayer, "layernorm", "rmsnorm");

// VisionTransformer's mlp_layer: timm's Mlp (fc1, act, fc2), SwiGLU (fc1_g and fc1_x of int(D * mlp_ratio) rows
// each: AIMv2) or SwiGLUPacked (one fc1 of int(D * mlp_ratio) rows, the first half the gates: DINOv2 giant). The
// gate's activation is act_layer. Eva chooses its MLP by swiglu_mlp instead.
enum class MlpLayer { mlp, swiglu, swiglu_packed };
VIT_ENUM_NAMES(MlpLayer, "mlp", "swiglu", "swiglu_packed");

// Which of timm's model classes the weights are laid out as: VisionTransformer (vision_transformer.py) or Eva
// (eva.py: EVA-02, DINOv3, RoPE-ViT, Perception Encoder). The two compute the same plain ViT; Eva names LayerScale
// gamma_1 / gamma_2, splits the qkv bias into q_bias and v_bias (attn_type "eva"), and has the options below
// (rotary embeddings, SwiGLU, inner norms) that VisionTransformer lacks.
enum class ModelClass { vision_transformer, eva };
VIT_ENUM_NAMES(ModelClass, "vision_transformer", "eva");

// timm's rope_type: axial rotary embeddings from fixed frequencies over patch indices (RotaryEmbeddingCat: EVA-02,
// RoPE-ViT axial), learned frequencies per block and head (RotaryEmbeddingMixed: RoPE-ViT mixed), or DINOv3's
// periods over patch centres normalised to [-1, 1] (RotaryEmbeddingDinoV3).
enum class RopeType { cat, mixed, dinov3 };
VIT_ENUM_NAMES(RopeType, "cat", "mixed", "dinov3");

// The order of the rotary grid's coordinates: (row, column) or (column, row), as torch.meshgrid's indexing.
enum class GridIndexing { ij, xy };
VIT_ENUM_NAMES(GridIndexing, "ij", "xy");

// Eva's attention module: EvaAttention (the qkv bias as q_bias and v_bias, no key bias) or timm's AttentionRope (one
// qkv bias).
enum class AttnType { eva, rope };
VIT_ENUM_NAMES(AttnType, "eva", "rope");

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
  int64_t reg_tokens = 0;        // learned register tokens after the class token (DINOv2 with registers): prefix tokens
  bool no_embed_class = false;   // pos_embed covers the patches only; prefix tokens get none (DeiT-3, DINOv2 registers)
  bool pre_norm = false;         // LayerNorm norm_pre after the position embedding, patch_embed without bias (CLIP)
  GlobalPool global_pool = GlobalPool::token;  // token: the class token; avg: mean of patch tokens; map: attn_pool
  bool final_norm = true;        // false: neither norm nor fc_norm after the blocks
  std::optional<bool> fc_norm;   // norm after pooling (fc_norm) instead of before it (norm); null = exactly with avg
  bool qk_norm = false;          // LayerNorm over each head's queries and keys (q_norm, k_norm) before q k^T
  Activation act_layer = Activation::gelu;  // MLP activation (also attn_pool's MLP)
  double drop_rate = 0.0;        // dropout before the head
  double pos_drop_rate = 0.0;    // dropout on the tokens after the position embedding (timm's pos_drop)
  double patch_drop_rate = 0.0;  // training only: this fraction of each image's patch tokens left out after the
                                 // position embedding, prefix tokens kept (timm's PatchDropout)
  double attn_drop_rate = 0.0;   // dropout on attention probabilities
  double proj_drop_rate = 0.0;   // dropout after attention/MLP projections
  double drop_path_rate = 0.0;   // stochastic depth, linear from 0 to this over the blocks
  std::optional<double> init_values;  // LayerScale initial value (absent = no LayerScale)
  double layer_norm_eps = 1e-6;  // LayerNorm epsilon (timm's ViT uses 1e-6)
  bool rel_pos_bias = false;     // learned 2-D relative position bias per head (added to attention logits)
  std::optional<int64_t> attn_pool_num_heads;  // heads of the MAP head (null = num_heads)
  std::optional<double> attn_pool_mlp_ratio;   // MLP ratio of the MAP head (null = mlp_ratio)
  NormLayer norm_layer = NormLayer::layernorm;  // every norm's kind (epsilon layer_norm_eps)
  std::optional<NormLayer> embed_norm_layer;  // a norm on the patch embedding's tokens (patch_embed.norm; null = none)
  bool proj_bias = true;                      // biases on attn.proj and the MLP's layers
  MlpLayer mlp_layer = MlpLayer::mlp;         // VisionTransformer's MLP form (see MlpLayer)

  // timm's Eva class and its options (model_class eva only).
  ModelClass model_class = ModelClass::vision_transformer;  // timm's class the weights are laid out as
  bool use_abs_pos_emb = true;                              // a learned pos_embed (false: rotary embeddings only)
  bool use_rot_pos_emb = false;        // rotary position embeddings on the patch tokens' queries and keys
  RopeType rope_type = RopeType::cat;  // how the rotary table is made (see RopeType)
  double rope_temperature = 10000.0;   // base of the rotary frequencies (cat, dinov3)
  double rope_grid_offset = 0.0;       // added to the rotary grid's coordinates
  GridIndexing rope_grid_indexing = GridIndexing::ij;  // the rotary grid's coordinate order
  bool rope_rotate_half = false;  // rotate the two halves of each head (x1, x2) -> (-x2, x1), else adjacent pairs
  int64_t ref_feat_h = 0;         // "ref_feat_shape": the grid cat's coordinates are scaled to (0 = none)
  int64_t ref_feat_w = 0;
  AttnType attn_type = AttnType::eva;  // Eva's attention module (see AttnType)
  bool qkv_fused = true;               // one qkv projection (false: q_proj, k_proj, v_proj)
  bool swiglu_mlp = false;             // SwiGLU MLP: silu(x W_g) * (x W_x), then fc2
  int64_t swiglu_align_to = 0;         // round the SwiGLU hidden width up to a multiple of this (0 = off)
  bool scale_mlp = false;              // a norm on the MLP's hidden activations (mlp.norm; Eva's SwiGLU split as fc1_g,
                                       // fc1_x); VisionTransformer's scale_mlp_norm
  bool scale_attn_inner = false;       // a norm on the merged heads before attn.proj (attn.norm); VisionTransformer's
                                       // scale_attn_norm
  bool attn_only_layer_scale = false;  // LayerScale on the attention branch only (gamma_1, no gamma_2)
  bool use_post_norm = false;          // residual post-norm blocks: x + norm1(attn(x)), then x + norm2(mlp(x))
  std::vector<int64_t> num_kv_heads;   // key/value heads (grouped-query attention): one per block, one for all, or none
  // The rotary grid's training-time augmentations (timm's and DINOv3's), drawn anew for every batch in training mode
  // and off in evaluation: one random shift of all coordinates, a log-uniform scale per axis, a log-uniform scale for
  // both axes.
  std::optional<double> rope_shift_coords;    // shift per axis uniform in [-s, s] (null = off)
  std::optional<double> rope_jitter_coords;   // scale per axis log-uniform in [1/j, j] (null = off)
  std::optional<double> rope_rescale_coords;  // one scale log-uniform in [1/r, r] (null = off)

  int64_t grid_h() const { return img_h / patch_size; }
  int64_t grid_w() const { return img_w / patch_size; }
  int64_t head_dim() const { return embed_dim / num_heads; }
  // Tokens before the patches: the class token, then the register tokens.
  int64_t num_prefix_tokens() const { return (class_token ? 1 : 0) + reg_tokens; }
  // The patch tokens an image keeps in training, of `patches`: timm's PatchDropout keeps max(1, int(patches * (1 -
  // patch_drop_rate))); evaluation keeps every one.
  int64_t patches_kept_in_training(int64_t patches) const {
    if (patch_drop_rate <= 0) return patches;
    return std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(patches) * (1.0 - patch_drop_rate)));
  }
  // Rows of pos_embed that belong to prefix tokens (none with no_embed_class).
  int64_t pos_embed_prefix() const { return no_embed_class ? 0 : num_prefix_tokens(); }
  // Whether the final norm sits after pooling (fc_norm) rather than on every token (norm): timm's use_fc_norm.
  bool use_fc_norm() const { return fc_norm.value_or(global_pool == GlobalPool::avg); }
  // The MLP's hidden width (what fc2 reads): embed_dim * mlp_ratio (as timm's int()), Eva's SwiGLU rounded up to
  // swiglu_align_to, half of it with mlp_layer swiglu_packed.
  int64_t mlp_hidden() const;
  // Whether the MLP is a SwiGLU (Eva's swiglu_mlp or VisionTransformer's mlp_layer): fc1 makes gates and values.
  bool gated_mlp() const { return swiglu_mlp || mlp_layer != MlpLayer::mlp; }
  // The gate's activation: SiLU in Eva's SwiGLU, act_layer in VisionTransformer's.
  Activation gate_activation() const { return swiglu_mlp ? Activation::silu : act_layer; }
  // Whether the MAP head attends over the prefix tokens too (timm's Eva), not the patches only (VisionTransformer).
  bool pool_includes_prefix() const { return model_class == ModelClass::eva; }
  // The MAP head's heads and hidden width.
  int64_t pool_heads() const { return attn_pool_num_heads.value_or(num_heads); }
  int64_t pool_hidden() const;
  // Whether the SwiGLU MLP has separate gate and value projections (fc1_g, fc1_x) rather than one packed fc1.
  bool swiglu_split() const {
    return (swiglu_mlp && (scale_mlp || swiglu_align_to > 0)) || mlp_layer == MlpLayer::swiglu;
  }
  // Block `layer`'s key/value heads (num_kv_heads, else num_heads).
  int64_t kv_heads(int64_t layer) const {
    if (num_kv_heads.empty()) return num_heads;
    return num_kv_heads.size() == 1 ? num_kv_heads[0] : num_kv_heads[static_cast<size_t>(layer)];
  }
  // Whether the qkv projection's bias is Eva's q_bias and v_bias (EvaAttention with a fused qkv and qkv_bias).
  bool eva_qkv_bias() const { return model_class == ModelClass::eva && attn_type == AttnType::eva && qkv_bias; }
};

// "model.<field>" in messages, through the field's name (util/fields.h's VIT_KEY). img_size is the one key that is
// two fields (img_h, img_w): kImgSizeKey.
#define VIT_MODEL_KEY(field) VIT_KEY(::vit::ModelConfig, "model", field)
inline constexpr const char* kImgSizeKey = "img_size";

// Whether a model field is a training-time dropout rate (every field named "..._rate"): in [0, 1), with no effect
// at inference, so formats that do not hold it (a timm snapshot's model_args as vit writes them, HF's config) drop it.
inline bool is_dropout_rate(const std::string& field) {
  return field.size() > 5 && field.compare(field.size() - 5, 5, "_rate") == 0;
}

// Upper bounds that validate() enforces: far beyond any published ViT, and low enough that every size derived from
// them (tokens, parameter and MAC counts in model/flops.h) fits in int64, so a hostile file's metadata can neither
// overflow that arithmetic nor describe an absurd model.
inline constexpr int64_t kMaxImageSide = 65536;    // img_size, each side
inline constexpr int64_t kMaxPatches = 65536;      // grid_h * grid_w (a 256 x 256 grid)
inline constexpr int64_t kMaxInChans = 1024;
inline constexpr int64_t kMaxEmbedDim = 32768;
inline constexpr int64_t kMaxDepth = 1024;
inline constexpr double kMaxMlpRatio = 16.0;
inline constexpr int64_t kMaxClasses = 1 << 20;    // num_classes; also the most classes a dataset may number

// Names of the presets (vit_tiny_patch16_224, ...).
std::vector<std::string> preset_names();
// The preset's model config; throws naming the unknown preset and the known ones.
ModelConfig model_preset(const std::string& name);

// The "model" section (`source` names the file in errors), and back.
ModelConfig parse_model_config(const nlohmann::json& section, const std::string& source);
nlohmann::json to_json(const ModelConfig& model);

// Another format's names for the model fields (timm's model_args, Hugging Face's config.json): the key that holds a
// field of the one field list ("img_size", "embed_dim", ...; config.cpp's visit_model), or "" where that format does
// not hold the field. The other formats' readers and writers go through these two functions, so a field added to the
// list is read and written everywhere its name is the format's.
using FieldSpelling = std::function<std::string(const std::string& field)>;
// Reads the fields `object` holds under `spelling`'s keys into `m` with the config's checked readers (a wrong type
// throws std::invalid_argument "<source>: <path>.<key>: ..."); fields it does not hold keep their values. Returns the
// keys of `object` that no field took, for the caller's own table.
std::vector<std::string> read_model_fields(const nlohmann::json& object, const std::string& path,
                                           const std::string& source, const FieldSpelling& spelling, ModelConfig& m);
// The fields `spelling` names, under its keys, written as to_json writes them (enums by name, an absent optional as
// null, img_size as one number when square).
nlohmann::json write_model_fields(const ModelConfig& m, const FieldSpelling& spelling);

// Throws std::invalid_argument with the reason when the model config is inconsistent.
void validate(const ModelConfig& model, const std::string& source);

}  // namespace vit
