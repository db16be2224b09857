// The modules a Vision Transformer is built from, module for module as timm's (timm/layers: Mlp, SwiGLU, Attention,
// AttentionRope, AttentionPoolLatent; vision_transformer.py's and eva.py's blocks), under timm's submodule names,
// which are the state-dict keys. model/vit.h assembles them into the model.
//
// Shape key: B batch, C in channels, H/W image size, P patch, gh/gw patch grid, N tokens (prefix + gh*gw), Np
// patches, D embed dim, nh heads, hd head dim (D / nh).
#pragma once

#include <array>
#include <memory>
#include <string>

#include <torch/torch.h>

#include "config/model_config.h"
#include "model/fused_block.h"
#include "model/precision.h"
#include "model/rope.h"

namespace vit {

// Boolean masks broadcastable to (B, nh, N, N); true = the query may attend to that key.
torch::Tensor causal_mask(int64_t tokens);                         // (N, N) lower triangle
torch::Tensor key_padding_mask(const torch::Tensor& keep_tokens);  // (B, N) bool -> (B, 1, 1, N)

// torch::nn::Linear without construction-time initialisation: the model initialises every weight once (timm's
// scheme) or, when it is about to be loaded from a file, not at all. Parameter names ("weight", "bias") and layout
// ((out, in), (out)) are nn.Linear's; forward goes through model/cpu_kernels' linear, or through `packed` (int8 or
// bf16, model/precision.h) when the model runs in reduced precision and no gradient is recorded.
struct LinearImpl : torch::nn::Module {
  LinearImpl(int64_t in_features, int64_t out_features, bool with_bias = true);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;                  // (out, in)
  torch::Tensor bias;                    // (out), undefined without bias
  std::shared_ptr<PackedLinear> packed;  // the weight in reduced precision, or null
};
TORCH_MODULE(Linear);

// timm's LayerNorm or RmsNorm over the last dim (norm_layer), under nn.LayerNorm's parameter names: weight, and bias
// for LayerNorm only.
struct NormImpl : torch::nn::Module {
  NormImpl(int64_t dim, NormLayer kind, double eps);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;  // (dim)
  torch::Tensor bias;    // (dim), undefined for rmsnorm
  NormLayer kind;
  double eps;
};
TORCH_MODULE(Norm);

// A norm of the model's kind (norm_layer) and epsilon (layer_norm_eps) over `dim` features.
Norm make_norm(const ModelConfig& config, int64_t dim);

struct PatchEmbedImpl : torch::nn::Module {
  explicit PatchEmbedImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x);  // (B, C, H, W) -> (B, gh*gw, D)
  torch::Tensor project(const torch::Tensor& x);  // the same before norm

  torch::nn::Conv2d proj{nullptr};  // bias unless pre_norm, as timm
  Norm norm{nullptr};               // on the tokens, with embed_norm_layer
  int64_t patch_size;
  std::shared_ptr<PackedLinear> packed;  // proj as a product over flattened patches in reduced precision, or null
};
TORCH_MODULE(PatchEmbed);

// Index into a relative position bias table for a gh x gw grid (seed article 001 §7.2, on an image grid as in BEiT):
// entries (dy, dx) between patches, offsets clipped to the trained grid's range so other sizes still work, plus the
// three prefix entries (prefix->patch, patch->prefix, prefix->prefix) shared by every prefix token (the class token,
// register tokens) when there are any.
torch::Tensor relative_position_index(int64_t trained_h, int64_t trained_w, int64_t grid_h, int64_t grid_w,
                                      int64_t prefix_tokens);  // (N, N) int64

// How attention computes softmax(q k^T / sqrt(hd)) v when nothing asks for the probabilities. Where they are asked
// for (export-attention, Capture::attention), the explicit path always runs: fused kernels never materialise them.
enum class AttentionKernel {
  automatic,         // sdpa on LibTorch >= 2; before it, the CPU core kernel (model/cpu_kernels.h) where it applies,
                     // else explicit. On the CPU in float32 the fused block (model/fused_block.h) takes the whole
                     // block where it covers the options (BlockImpl::forward)
  sdpa,              // at::scaled_dot_product_attention (flash / memory-efficient / math); LibTorch >= 2 only
  explicit_softmax,  // q k^T, softmax, @ v written out, as timm's fused_attn=False: the reference for the others
};
// True when this build's LibTorch has scaled_dot_product_attention (>= 2.0).
bool sdpa_available();

struct AttentionImpl : torch::nn::Module {
  // layer: the block's index, for its key/value heads (ModelConfig::kv_heads).
  explicit AttentionImpl(const ModelConfig& config, int64_t layer = 0);
  // x: (B, N, D); grid: the patch grid of x (for the relative bias); mask: optional bool, broadcastable to
  // (B, nh, N, N). probs_out: when given, receives the softmax probabilities (B, nh, N, N) the output used.
  // rope: the rotary table for the patch tokens (model/rope.h), or undefined.
  torch::Tensor forward(const torch::Tensor& x, std::array<int64_t, 2> grid, const torch::Tensor& mask = {},
                        torch::Tensor* probs_out = nullptr, const torch::Tensor& rope = {});
  // (nh, N, N) relative position bias for a grid, or undefined without rel_pos_bias.
  torch::Tensor relative_bias(std::array<int64_t, 2> grid);
  // x (B, N, D) -> q, k, v side by side (B, N, 3D), through whichever projections the model has (not with
  // grouped-query attention: its k and v are narrower).
  torch::Tensor project_qkv(const torch::Tensor& x);
  // The fused qkv's bias (3D): its own, EvaAttention's q_bias / zeros / v_bias, or undefined for none.
  torch::Tensor qkv_bias() const;

  Linear qkv{nullptr}, proj{nullptr};
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr};  // qkv_fused false (Eva)
  torch::Tensor q_bias, v_bias;  // Eva's qkv bias (ModelConfig::eva_qkv_bias): the key's is zero and not stored
  Norm q_norm{nullptr}, k_norm{nullptr};  // over hd, only with qk_norm
  Norm norm{nullptr};                     // over the merged heads, only with scale_attn_inner
  bool rope_rotate_half = false;
  torch::Tensor relative_position_bias_table;  // ((2gh-1)(2gw-1) [+3 with prefix tokens], nh) when rel_pos_bias
  int64_t num_heads, head_dim;
  int64_t num_kv_heads;  // fewer than num_heads: grouped-query attention (k_proj, v_proj of num_kv_heads * hd rows)
  double scale;
  std::array<int64_t, 2> trained_grid;  // the grid the bias table was made for
  int64_t prefix_tokens;                // class and register tokens before the patches
  double attn_drop, proj_drop;
  torch::Tensor head_mask;  // (nh) 1 = keep, 0 = ablated head; undefined = all heads on
  AttentionKernel kernel = AttentionKernel::automatic;
};
TORCH_MODULE(Attention);

// The MLP activation of act_layer, elementwise.
torch::Tensor activation(const torch::Tensor& x, Activation act);

// The MLP's form: fc1, act, fc2 (timm's Mlp); SwiGLU with one packed fc1 of gate then value rows (timm's GluMlp,
// gate first); SwiGLU with separate fc1_g and fc1_x (timm's SwiGLU). A SwiGLU's act is its gate's.
enum class MlpKind { plain, swiglu_packed, swiglu_split };

struct MlpImpl : torch::nn::Module {
  // hidden: the activation's width (a packed SwiGLU's fc1 has twice as many rows). bias: on fc1 (fc1_g, fc1_x) and
  // fc2. inner_norm: a norm over the hidden activations before fc2 (mlp.norm), registered as given; none if null.
  MlpImpl(int64_t dim, int64_t hidden, double drop, Activation act = Activation::gelu, MlpKind kind = MlpKind::plain,
          bool bias = true, Norm inner_norm = nullptr);
  torch::Tensor forward(const torch::Tensor& x);

  Linear fc1{nullptr}, fc2{nullptr};
  Linear fc1_g{nullptr}, fc1_x{nullptr};  // swiglu_split
  Norm norm{nullptr};
  double drop;
  Activation act;
  MlpKind kind;
};
TORCH_MODULE(Mlp);

// global_pool "map": timm's AttentionPoolLatent with one latent query. The latent, projected by q, attends over the
// tokens it is given (keys and values from kv), the heads are merged through proj, and x + mlp(norm(x)) follows.
struct AttentionPoolImpl : torch::nn::Module {
  explicit AttentionPoolImpl(const ModelConfig& config);
  // x: (B, Np, D) -> (B, D). probs_out: when given, receives the attention (B, nh, 1, Np), nh = pool_heads().
  torch::Tensor forward(const torch::Tensor& x, torch::Tensor* probs_out = nullptr);

  torch::Tensor latent;  // (1, 1, D)
  Linear q{nullptr}, kv{nullptr}, proj{nullptr};
  Norm norm{nullptr};
  Mlp mlp{nullptr};
  int64_t num_heads, head_dim;
  double scale;
};
TORCH_MODULE(AttentionPool);

struct LayerScaleImpl : torch::nn::Module {
  LayerScaleImpl(int64_t dim, double init_value);
  torch::Tensor forward(const torch::Tensor& x) { return x * gamma; }
  torch::Tensor gamma;  // (D)
};
TORCH_MODULE(LayerScale);

struct BlockImpl : torch::nn::Module {
  BlockImpl(const ModelConfig& config, double drop_path_rate, int64_t layer = 0);
  // On the CPU in float32, through the fused block (model/fused_block.h) where it covers the options and nothing asks
  // for the attention probabilities, a mask or a head mask; otherwise operator by operator.
  // rope: this block's rotary table (model/rope.h), or undefined.
  torch::Tensor forward(const torch::Tensor& x, std::array<int64_t, 2> grid, const torch::Tensor& mask,
                        torch::Tensor* probs_out, const torch::Tensor& rope = {});
  // The option that keeps this block off the fused path ("qk_norm", ...), or empty when it is covered.
  std::string fused_refusal() const;
  // This block's weights as the fused block reads them (model/fused_block.h), rope its rotary table.
  BlockParameters fused_parameters(const torch::Tensor& rope) const;
  // Its linear layers packed in int8 where every one is and no gradient is recorded (BlockParameters::int8), for the
  // fused block; empty otherwise, and for a packed SwiGLU fc1 (whose halves the fused block multiplies apart).
  std::vector<std::shared_ptr<PackedLinear>> int8_layers() const;

  Norm norm1{nullptr}, norm2{nullptr};
  Attention attn{nullptr};
  Mlp mlp{nullptr};
  LayerScale ls1{nullptr}, ls2{nullptr};  // only when init_values is set (VisionTransformer's names)
  torch::Tensor gamma_1, gamma_2;         // the same with model_class eva (gamma_2 absent with attn_only_layer_scale)
  bool post_norm = false;                 // use_post_norm: the norms after the branches (EvaBlockPostNorm)
  double drop_path_rate;                  // stochastic depth probability of this block
  bool fused = true;  // may take the fused CPU block; false keeps the per-operator path (tests compare them)
  bool bf16_products = false;  // the fused block's products in bfloat16 (BlockShape::bf16); the other path ignores it
  // The fused block's packed weights for float32 inference, kept between calls (BlockParameters::packed).
  std::shared_ptr<PackedProducts> packed_products = std::make_shared<PackedProducts>();
};
TORCH_MODULE(Block);

}  // namespace vit
