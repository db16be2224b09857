// The Vision Transformer, module for module as timm's `VisionTransformer`: same submodule names (= state-dict keys),
// same semantics, so timm weights load without a mapping table.
//
// Shape key: B batch, C in channels, H/W image size, P patch, gh/gw patch grid, N tokens (prefix + gh*gw: the class
// token, then reg_tokens register tokens, then the patches), Np patches, D embed dim, nh heads, hd head dim (D / nh),
// K classes.
//
// timm's options of the wider family, each under timm's name (model_config.h): reg_tokens, no_embed_class (the
// position embedding covers the patches only, added before the prefix tokens are prepended), pre_norm (norm_pre
// after the embedding, a patch embedding without bias), qk_norm (q_norm, k_norm over each head), act_layer,
// final_norm and fc_norm (where the last norm sits), global_pool "map" (attn_pool: one learned latent query attends
// over the patch tokens, then proj, and a residual MLP behind a norm), and AIMv2's and DINOv2 giant's: norm_layer
// rmsnorm, embed_norm_layer (patch_embed.norm), proj_bias false, mlp_layer swiglu / swiglu_packed.
//
// With model_class eva the same modules take timm's Eva names and options: rotary embeddings on the patch tokens'
// queries and keys (rope, model/rope.h), no learned pos_embed (use_abs_pos_emb false), q_bias / v_bias or
// q_proj / k_proj / v_proj, attn.norm (scale_attn_inner), SwiGLU MLPs (mlp.fc1 packed, or fc1_g / fc1_x with
// mlp.norm), gamma_1 / gamma_2 for LayerScale.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "config/model_config.h"
#include "model/precision.h"
#include "model/rope.h"

namespace vit {

// What a forward pass should hand back besides its output (export-attention, parity tests, ablation).
struct Capture {
  bool attention = false;                 // keep each block's softmax probabilities
  bool block_outputs = false;             // keep each block's output tokens
  std::vector<torch::Tensor> attention_probs;  // per block: (B, nh, N, N), rows = queries; part of the graph
  std::vector<torch::Tensor> outputs;          // per block: (B, N, D)
  torch::Tensor embed;                         // tokens after position embedding (and norm_pre): (B, N, D)
  torch::Tensor pool_attention;  // with global_pool "map" (forward_head): (B, nh, 1, Np), the latent's attention
                                 // (over all N tokens with model_class eva: ModelConfig::pool_includes_prefix)
};

// Boolean masks broadcastable to (B, nh, N, N); true = the query may attend to that key.
torch::Tensor causal_mask(int64_t tokens);                          // (N, N) lower triangle
torch::Tensor key_padding_mask(const torch::Tensor& keep_tokens);   // (B, N) bool -> (B, 1, 1, N)

// torch::nn::Linear without construction-time initialisation: the model initialises every weight once (timm's
// scheme) or, when it is about to be loaded from a file, not at all. Parameter names ("weight", "bias") and layout
// ((out, in), (out)) are nn.Linear's; forward goes through model/cpu_kernels' linear, or through `packed` (int8 or
// bf16, model/precision.h) when the model runs in reduced precision and no gradient is recorded.
struct LinearImpl : torch::nn::Module {
  LinearImpl(int64_t in_features, int64_t out_features, bool with_bias = true);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;  // (out, in)
  torch::Tensor bias;    // (out), undefined without bias
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

// Whether a new model draws its initial weights (training) or leaves them uninitialised because a file's weights
// are about to be copied in (model_file's load_model): skipping the draws saves ~0.5 s for ViT-B/16.
enum class Init { random, none };

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
  // Whether the projections are the plain fused qkv (with its own bias or none), as the fused kernels read them.
  bool plain_qkv() const { return qkv && !q_bias.defined(); }

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
  int64_t prefix_tokens;                 // class and register tokens before the patches
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
  // hidden: the activation's width (a packed SwiGLU's fc1 has twice as many rows). inner_norm: a norm on the hidden
  // activations before fc2 (mlp.norm), of the model's norm_layer and epsilon. bias: on fc1 (fc1_g, fc1_x) and fc2.
  MlpImpl(int64_t dim, int64_t hidden, double drop, Activation act = Activation::gelu, MlpKind kind = MlpKind::plain,
          const ModelConfig* inner_norm = nullptr, bool bias = true);
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

  Norm norm1{nullptr}, norm2{nullptr};
  Attention attn{nullptr};
  Mlp mlp{nullptr};
  LayerScale ls1{nullptr}, ls2{nullptr};  // only when init_values is set (VisionTransformer's names)
  torch::Tensor gamma_1, gamma_2;         // the same with model_class eva (gamma_2 absent with attn_only_layer_scale)
  bool rotary = false;                    // the model gives this block a rotary table
  bool post_norm = false;                 // use_post_norm: the norms after the branches (EvaBlockPostNorm)
  double drop_path_rate;  // stochastic depth probability of this block
  bool fused = true;      // may take the fused CPU block; false keeps the per-operator path (tests compare them)
};
TORCH_MODULE(Block);

struct VisionTransformerImpl : torch::nn::Module {
  // Init::none leaves the weights' contents undefined until they are loaded (load_state).
  explicit VisionTransformerImpl(const ModelConfig& config, Init init = Init::random);

  // The device the parameters are on.
  torch::Device device() const;
  // (B, C, H, W) -> (B, K) logits (or pooled features when num_classes == 0).
  torch::Tensor forward(const torch::Tensor& x);
  // (B, C, H, W) -> (B, N, D) tokens after the final norm. mask as in Attention; capture is optional.
  torch::Tensor forward_features(const torch::Tensor& x, const torch::Tensor& mask = {}, Capture* capture = nullptr);
  // Pool (class token, mean of patches, or attn_pool over the patches), fc_norm, head dropout, head:
  // (B, N, D) -> (B, K). capture: with Capture::attention, receives the pooling attention of a MAP head.
  torch::Tensor forward_head(const torch::Tensor& tokens, bool pre_logits = false, Capture* capture = nullptr);

  // Position embedding for a gh x gw grid: the trained one, or resampled bicubically (prefix rows kept):
  // (1, pos_embed_prefix + gh*gw, D). Undefined without use_abs_pos_emb.
  torch::Tensor pos_embed_for(int64_t grid_h, int64_t grid_w);
  // Zeroes the outputs of the given heads of block `layer` (head ablation); an empty list restores the block.
  void set_head_mask(int64_t layer, const std::vector<int64_t>& heads);
  // Chooses the attention kernel of every block (tests compare them; AttentionKernel::sdpa needs LibTorch >= 2).
  void set_attention_kernel(AttentionKernel kernel);
  // Lets every block take the fused CPU path where it applies (the default), or keeps them all operator by operator.
  void set_fused_blocks(bool on);
  // Runs inference in `precision` (model/precision.h) on the device the parameters are on now (move the model first):
  // on the CPU every linear layer and the patch embedding are packed in int8 or bf16 (from the current weights; the
  // float32 ones stay for gradients); on CUDA forward runs under fp16 or bf16 autocast. fp32 undoes either. Throws
  // precision_refusal's reason where this build or machine cannot.
  void set_precision(Precision precision);
  Precision precision() const { return precision_; }
  // Bytes the weights inference reads: float32 parameters, each packed layer counted at its packed size (the float32
  // copies stay beside them for gradients).
  int64_t weight_bytes();
  // The state-dict names of the weights that int8 quantizes (every linear layer's, the patch embedding's): what an
  // int8 model file stores in int8 (io/model_file.h).
  std::vector<std::string> quantized_weight_names();
  // Re-initialises all parameters as timm's default init ("jax"-free): trunc-normal(0.02) for Linear and pos_embed,
  // normal(1e-6) for cls_token and reg_token, trunc-normal(D^-0.5) for attn_pool's latent, zero biases, LayerNorm
  // (1, 0). model_class eva as timm's Eva: trunc-normal(0.02) for the tokens too, attn.proj and mlp.fc2 divided by
  // sqrt(2 (layer + 1)), the head scaled by 0.001, rope.freqs randomly rotated. Deterministic given torch's
  // generator state.
  void reset_parameters();

  const ModelConfig& config() const { return config_; }
  int64_t num_prefix_tokens() const { return config_.num_prefix_tokens(); }

  PatchEmbed patch_embed{nullptr};
  torch::Tensor cls_token;  // (1, 1, D), with class_token
  torch::Tensor reg_token;  // (1, reg_tokens, D), with reg_tokens > 0
  torch::Tensor pos_embed;  // (1, pos_embed_prefix + gh*gw, D), with use_abs_pos_emb
  RotaryEmbedding rope{nullptr};           // with use_rot_pos_emb
  Norm norm_pre{nullptr};                  // with pre_norm
  torch::nn::ModuleList blocks{nullptr};
  Norm norm{nullptr};                     // final norm on every token (final_norm, not use_fc_norm)
  AttentionPool attn_pool{nullptr};       // global_pool "map"
  Norm fc_norm{nullptr};                  // norm after pooling (final_norm and use_fc_norm)
  Linear head{nullptr};                   // absent when num_classes == 0

 private:
  bool cuda_autocast(const torch::Tensor& x) const;    // reduced precision on CUDA: forward under autocast
  bool chunked_inference(const torch::Tensor& x) const;  // on the CPU, no gradient recorded

  ModelConfig config_;
  Precision precision_ = Precision::fp32;
};
TORCH_MODULE(VisionTransformer);

// Resamples a (1, [prefix +] gh0*gw0, D) position embedding to a gh x gw grid (bicubic with antialias on, in both
// directions, prefix rows kept), exactly as timm's resample_abs_pos_embed with its defaults.
torch::Tensor resample_pos_embed(const torch::Tensor& pos_embed, int64_t old_h, int64_t old_w, int64_t new_h,
                                 int64_t new_w, int64_t num_prefix_tokens);

// Counts parameters (all, trainable or not).
int64_t count_parameters(const torch::nn::Module& module);

}  // namespace vit
