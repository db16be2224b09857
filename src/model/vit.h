// The Vision Transformer, module for module as timm's `VisionTransformer`: same submodule names (= state-dict keys),
// same semantics, so timm weights load without a mapping table.
//
// Shape key: B batch, C in channels, H/W image size, P patch, gh/gw patch grid, N tokens (gh*gw [+1 class token]),
// D embed dim, nh heads, hd head dim (D / nh), K classes.
#pragma once

#include <array>
#include <optional>
#include <vector>

#include <torch/torch.h>

#include "config/model_config.h"

namespace vit {

// What a forward pass should hand back besides its output (export-attention, parity tests, ablation).
struct Capture {
  bool attention = false;                 // keep each block's softmax probabilities
  bool block_outputs = false;             // keep each block's output tokens
  std::vector<torch::Tensor> attention_probs;  // per block: (B, nh, N, N), rows = queries; part of the graph
  std::vector<torch::Tensor> outputs;          // per block: (B, N, D)
  torch::Tensor embed;                         // tokens after position embedding: (B, N, D)
};

// Boolean masks broadcastable to (B, nh, N, N); true = the query may attend to that key.
torch::Tensor causal_mask(int64_t tokens);                          // (N, N) lower triangle
torch::Tensor key_padding_mask(const torch::Tensor& keep_tokens);   // (B, N) bool -> (B, 1, 1, N)

// torch::nn::Linear without construction-time initialisation: the model initialises every weight once (timm's
// scheme) or, when it is about to be loaded from a file, not at all. Parameter names ("weight", "bias") and layout
// ((out, in), (out)) are nn.Linear's; forward goes through model/cpu_kernels' linear.
struct LinearImpl : torch::nn::Module {
  LinearImpl(int64_t in_features, int64_t out_features, bool with_bias = true);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;  // (out, in)
  torch::Tensor bias;    // (out), undefined without bias
};
TORCH_MODULE(Linear);

// Whether a new model draws its initial weights (training) or leaves them uninitialised because a file's weights
// are about to be copied in (model_file's load_model): skipping the draws saves ~0.5 s for ViT-B/16.
enum class Init { random, none };

struct PatchEmbedImpl : torch::nn::Module {
  explicit PatchEmbedImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x);  // (B, C, H, W) -> (B, gh*gw, D)

  torch::nn::Conv2d proj{nullptr};
  int64_t patch_size;
};
TORCH_MODULE(PatchEmbed);

// Index into a relative position bias table for a gh x gw grid (seed article 001 §7.2, on an image grid as in BEiT):
// entries (dy, dx) between patches, offsets clipped to the trained grid's range so other sizes still work, plus the
// three class-token entries (class->patch, patch->class, class->class) when there is a class token.
torch::Tensor relative_position_index(int64_t trained_h, int64_t trained_w, int64_t grid_h, int64_t grid_w,
                                      bool class_token);  // (N, N) int64

// How attention computes softmax(q k^T / sqrt(hd)) v when nothing asks for the probabilities. Where they are asked
// for (export-attention, Capture::attention), the explicit path always runs: fused kernels never materialise them.
enum class AttentionKernel {
  automatic,         // sdpa on LibTorch >= 2; before it, the CPU core kernel (model/cpu_kernels.h) where it applies,
                     // else explicit
  sdpa,              // at::scaled_dot_product_attention (flash / memory-efficient / math); LibTorch >= 2 only
  explicit_softmax,  // q k^T, softmax, @ v written out, as timm's fused_attn=False: the reference for the others
};
// True when this build's LibTorch has scaled_dot_product_attention (>= 2.0).
bool sdpa_available();

struct AttentionImpl : torch::nn::Module {
  AttentionImpl(const ModelConfig& config);
  // x: (B, N, D); grid: the patch grid of x (for the relative bias); mask: optional bool, broadcastable to
  // (B, nh, N, N). probs_out: when given, receives the softmax probabilities (B, nh, N, N) the output used.
  torch::Tensor forward(const torch::Tensor& x, std::array<int64_t, 2> grid, const torch::Tensor& mask = {},
                        torch::Tensor* probs_out = nullptr);
  // (nh, N, N) relative position bias for a grid, or undefined without rel_pos_bias.
  torch::Tensor relative_bias(std::array<int64_t, 2> grid);

  Linear qkv{nullptr}, proj{nullptr};
  torch::Tensor relative_position_bias_table;  // ((2gh-1)(2gw-1) [+3], nh) when rel_pos_bias
  int64_t num_heads, head_dim;
  double scale;
  std::array<int64_t, 2> trained_grid;  // the grid the bias table was made for
  bool class_token;
  double attn_drop, proj_drop;
  torch::Tensor head_mask;  // (nh) 1 = keep, 0 = ablated head; undefined = all heads on
  AttentionKernel kernel = AttentionKernel::automatic;
};
TORCH_MODULE(Attention);

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t dim, int64_t hidden, double drop);
  torch::Tensor forward(const torch::Tensor& x);

  Linear fc1{nullptr}, fc2{nullptr};
  double drop;
};
TORCH_MODULE(Mlp);

struct LayerScaleImpl : torch::nn::Module {
  LayerScaleImpl(int64_t dim, double init_value);
  torch::Tensor forward(const torch::Tensor& x) { return x * gamma; }
  torch::Tensor gamma;  // (D)
};
TORCH_MODULE(LayerScale);

struct BlockImpl : torch::nn::Module {
  BlockImpl(const ModelConfig& config, double drop_path_rate);
  torch::Tensor forward(const torch::Tensor& x, std::array<int64_t, 2> grid, const torch::Tensor& mask,
                        torch::Tensor* probs_out);

  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  Attention attn{nullptr};
  Mlp mlp{nullptr};
  LayerScale ls1{nullptr}, ls2{nullptr};  // only when init_values is set
  double drop_path_rate;  // stochastic depth probability of this block
};
TORCH_MODULE(Block);

struct VisionTransformerImpl : torch::nn::Module {
  // Init::none leaves the weights' contents undefined until they are loaded (load_state).
  explicit VisionTransformerImpl(const ModelConfig& config, Init init = Init::random);

  // (B, C, H, W) -> (B, K) logits (or pooled features when num_classes == 0).
  torch::Tensor forward(const torch::Tensor& x);
  // (B, C, H, W) -> (B, N, D) tokens after the final norm. mask as in Attention; capture is optional.
  torch::Tensor forward_features(const torch::Tensor& x, const torch::Tensor& mask = {}, Capture* capture = nullptr);
  // Pool (class token or mean of patches), fc_norm, head dropout, head: (B, N, D) -> (B, K).
  torch::Tensor forward_head(const torch::Tensor& tokens, bool pre_logits = false);

  // Position embedding for a gh x gw grid: the trained one, or resampled bicubically (class slot kept).
  torch::Tensor pos_embed_for(int64_t grid_h, int64_t grid_w);
  // Zeroes the outputs of the given heads of block `layer` (head ablation); an empty list restores the block.
  void set_head_mask(int64_t layer, const std::vector<int64_t>& heads);
  // Chooses the attention kernel of every block (tests compare them; AttentionKernel::sdpa needs LibTorch >= 2).
  void set_attention_kernel(AttentionKernel kernel);
  // Re-initialises all parameters as timm's default init ("jax"-free): trunc-normal(0.02) for Linear and pos_embed,
  // normal(1e-6) for cls_token, zero biases, LayerNorm (1, 0). Deterministic given torch's generator state.
  void reset_parameters();

  const ModelConfig& config() const { return config_; }
  int64_t num_prefix_tokens() const { return config_.class_token ? 1 : 0; }

  PatchEmbed patch_embed{nullptr};
  torch::Tensor cls_token;  // (1, 1, D)
  torch::Tensor pos_embed;  // (1, [1 +] gh*gw, D)
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm norm{nullptr};     // final norm (token pooling)
  torch::nn::LayerNorm fc_norm{nullptr};  // norm after average pooling (global_pool avg)
  Linear head{nullptr};                   // absent when num_classes == 0

 private:
  ModelConfig config_;
};
TORCH_MODULE(VisionTransformer);

// Resamples a (1, [prefix +] gh0*gw0, D) position embedding to a gh x gw grid (bicubic, antialiased when
// shrinking, prefix tokens kept), as timm's resample_abs_pos_embed.
torch::Tensor resample_pos_embed(const torch::Tensor& pos_embed, int64_t old_h, int64_t old_w, int64_t new_h,
                                 int64_t new_w, int64_t num_prefix_tokens);

// Counts parameters (all, trainable or not).
int64_t count_parameters(const torch::nn::Module& module);

}  // namespace vit
