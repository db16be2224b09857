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
#include "model/layers.h"
#include "model/precision.h"

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

// Whether a new model draws its initial weights (training) or leaves them uninitialised because a file's weights
// are about to be copied in (model_file's load_model): skipping the draws saves ~0.5 s for ViT-B/16.
enum class Init { random, none };

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
  // Runs the fused CPU blocks' linear products in bfloat16 with float32 accumulation, forward and backward
  // (BlockShape::bf16: CPU mixed precision for training, train.amp bf16); the caller checks
  // cpu_bf16_refusal() (model/precision.h) first. Blocks off the fused path stay float32.
  void set_bf16_products(bool on);
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

// timm's PatchDropout (ordered false): keeps the first `prefix` tokens of (B, N, D) `tokens` and, of the patch tokens
// after them, a random `keep` for each image (ModelConfig::patches_kept_in_training), in random order.
torch::Tensor drop_patches(const torch::Tensor& tokens, int64_t keep, int64_t prefix);

// The logits evaluation and prediction score with: the model's, or with `hflip` (Preprocess::eval_hflip) the mean of
// each image's and its horizontal mirror's, so that an image and its mirror get the same logits.
torch::Tensor eval_logits(VisionTransformer& net, const torch::Tensor& images, bool hflip);

// Counts parameters (all, trainable or not).
int64_t count_parameters(const torch::nn::Module& module);

}  // namespace vit
