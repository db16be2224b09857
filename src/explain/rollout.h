// Attention rollout (Abnar & Zuidema 2020), gradient-weighted rollout, transformer attribution (Chefer et al. 2021),
// attention Grad-CAM and the perturbation (faithfulness) curves: the numeric core of `vit export-attention`.
// Core library: torch only, no OpenCV.
//
// Shape key: nh heads, N tokens (prefix + gh*gw), gh/gw patch grid, C/H/W image, K classes.
//
// Attention rollout, head fusion f (mean | max | min), discard ratio d, prefix tokens p (1 = class token):
//   R = I (N, N)
//   for each block b in forward order:
//     F = f over heads of A_b                      (heads switched off by a head mask are left out)
//     zero the floor(d * N * (N - p)) smallest entries of F outside the prefix columns (the class token's column
//       is never dropped; ties broken by index)
//     F = F + I;  F = F / F.sum(-1, keepdim)       (each row sums to 1)
//     R = F @ R
//   map = (r R)[p:] for the head's readout r (head_readout below: the class token's row for token pooling, the mean
//         of the patch rows for average pooling, or a MAP head's pooling attention), reshaped row-major to (gh, gw),
//         divided by its max (an all-zero map stays zero). Register tokens are prefix tokens: maps cover the
//         patches only.
// Gradient rollout for class c (Chefer et al. 2021 / jacobgil's grad_rollout with blocks multiplied in forward
// order, rows renormalised with keepdim):
//   G_b = d logit_c / d A_b (the pre-softmax class score; gradients of the same forward pass)
//   F = mean over all heads of A_b * max(G_b, 0)   (a switched-off head has G_b = 0, so it adds nothing)
//   then discard, + I, renormalise, R = F @ R and the map exactly as above.
// Transformer attribution for class c (Chefer, Gur & Wolf, ICCV 2021, "Generic Attention-model Explainability"):
//   R = I (N, N)
//   for each block b >= start_layer:  Abar = mean over heads of max(G_b * A_b, 0)   (each head's product clamped,
//                                                                                    then averaged)
//                                     R = R + Abar @ R
//   map = (r R)[p:] / max, as above (no row renormalisation: R keeps the identity's share of every token).
// Attention Grad-CAM for class c on the last block L (Chefer et al.'s ViT baseline, after Selvaraju et al.):
//   a_h = r A_L[h], g_h = r G_L[h] (the readout's row of each head's attention and of its gradient, (N))
//   w_h = mean over the patches of g_h;  map = max(mean over heads of w_h * a_h[p:], 0) / max
// Raw attention: the last block's readout row, head mean over the heads that are on, / max.
// Readout r: every method reads the row of the query the head uses (head_readout): a model that pools the patch
// tokens (global_pool avg) never reads the class token, so its maps use the mean of the patch rows.
// Everything is computed in float64 and returned as float32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "model/vit.h"

namespace vit {

// Throws std::invalid_argument naming the bad value unless fusion is "mean", "max" or "min".
void check_head_fusion(const std::string& fusion);

// One block's heads fused: (nh, N, N) -> (N, N) float64. keep: optional (nh) mask, nonzero = head is on; when it
// is given, only those heads are fused, and a block with every head off fuses to zeros (the block adds nothing).
torch::Tensor fuse_heads(const torch::Tensor& attention, const std::string& fusion, const torch::Tensor& keep = {});

// Zeroes the floor(ratio * N * (N - prefix_tokens)) smallest entries of a fused (N, N) matrix among the columns
// >= prefix_tokens; the class token's column is never touched. Returns a new tensor.
torch::Tensor discard_lowest(const torch::Tensor& fused, double ratio, int64_t prefix_tokens);

// (F + I) with each row divided by its sum: (N, N) -> (N, N).
torch::Tensor add_identity_and_normalise(const torch::Tensor& fused);

// Which query the model's head reads, as weights over the N tokens (float64, summing to 1):
//   global_pool "map": the pooling head's latent query, i.e. its attention over the patches (pool_attention, (nh, 1,
//     Np) or (nh, Np)), averaged over heads, zero on the prefix tokens;
//   global_pool "token": the class token (one-hot at 0);
//   global_pool "avg" (with or without a class token, which the head never reads): the mean of the patch rows,
//     zero on the prefix tokens, as timm's avg pool leaves them out.
torch::Tensor head_readout(const ModelConfig& model, const torch::Tensor& pool_attention = {});
// In words, for summary.json.
std::string head_readout_name(const ModelConfig& model);

// The rolled-out (N, N) matrix as a (grid_h, grid_w) map: readout @ rollout over the patches (without a readout, the
// class token's row, or the mean of all rows when prefix_tokens == 0), row-major, divided by its max. Checks
// N == prefix_tokens + grid_h * grid_w.
torch::Tensor rollout_to_map(const torch::Tensor& rollout, int64_t prefix_tokens, int64_t grid_h, int64_t grid_w,
                             const torch::Tensor& readout = {});

// Attention rollout of one image. attentions: per block (nh, N, N) softmax probabilities; head_keep: empty, or per
// block an (nh) mask of the heads that are on. Returns float32 (grid_h, grid_w).
torch::Tensor attention_rollout(const std::vector<torch::Tensor>& attentions, const std::string& fusion,
                                double discard_ratio, int64_t prefix_tokens, int64_t grid_h, int64_t grid_w,
                                const std::vector<torch::Tensor>& head_keep = {}, const torch::Tensor& readout = {});

// Gradient rollout of one image: gradients[b] = d(class logit)/d(attentions[b]), both (nh, N, N).
// Returns float32 (grid_h, grid_w).
torch::Tensor gradient_rollout(const std::vector<torch::Tensor>& attentions,
                               const std::vector<torch::Tensor>& gradients, double discard_ratio,
                               int64_t prefix_tokens, int64_t grid_h, int64_t grid_w, const torch::Tensor& readout = {});

// Transformer attribution of one image (formula above): gradients[b] = d(class logit)/d(attentions[b]). Blocks
// before start_layer are skipped (0 = all). Returns float32 (grid_h, grid_w).
torch::Tensor transformer_attribution(const std::vector<torch::Tensor>& attentions,
                                      const std::vector<torch::Tensor>& gradients, int64_t start_layer,
                                      int64_t prefix_tokens, int64_t grid_h, int64_t grid_w,
                                      const torch::Tensor& readout = {});

// Attention Grad-CAM of one image on one block (the last, by the method's definition): attention and gradient
// (nh, N, N). Returns float32 (grid_h, grid_w); all zero when no head's weighted attention is positive.
torch::Tensor attention_gradcam(const torch::Tensor& attention, const torch::Tensor& gradient, int64_t prefix_tokens,
                                int64_t grid_h, int64_t grid_w, const torch::Tensor& readout = {});

// Each head's class-token attention of one block as maps: (nh, N, N) -> float32 (nh, grid_h, grid_w), each map
// divided by its own max (without a class token: the mean attention every patch receives; with a readout, the
// readout-weighted rows).
torch::Tensor class_attention_maps(const torch::Tensor& attention, int64_t prefix_tokens, int64_t grid_h,
                                   int64_t grid_w, const torch::Tensor& readout = {});
// The head mean of those (over the heads that are on when keep is given and not all off), then / max:
// float32 (grid_h, grid_w).
torch::Tensor class_attention_mean(const torch::Tensor& attention, int64_t prefix_tokens, int64_t grid_h,
                                   int64_t grid_w, const torch::Tensor& keep = {}, const torch::Tensor& readout = {});

// Per block, an (nh) float mask of the heads that are on (1) or ablated by set_head_mask (0).
std::vector<torch::Tensor> head_keep_masks(VisionTransformer& net);

// What one forward pass (and, when asked, one backward pass) of one image yields, on the CPU in float32.
struct AttentionCapture {
  torch::Tensor logits;                     // (K)
  std::vector<torch::Tensor> attentions;    // per block (nh, N, N), the probabilities the forward pass used
  std::vector<torch::Tensor> gradients;     // per block (nh, N, N) d logit[gradient_class] / d attention; or empty
  torch::Tensor pool_attention;             // global_pool "map": (nh, 1, Np), the pooling head's attention
  int64_t gradient_class = -1;              // the class the gradients are for (-1 when none were taken)
};

// Runs image (C, H, W), already preprocessed, through forward_features + forward_head with the attention
// probabilities captured (explicit attention, never a fused kernel). gradient_class: -1 = no gradients;
// kPredictedClass = the arg-max class; otherwise that class (checked against K).
inline constexpr int64_t kPredictedClass = -2;
AttentionCapture capture_attention(VisionTransformer& net, const torch::Tensor& image, int64_t gradient_class);

// Patch indices (row-major over the grid) sorted by importance, highest first; ties keep index order.
std::vector<int64_t> importance_order(const torch::Tensor& heat);
// A uniformly random permutation of 0..count-1 from a seeded std::mt19937_64 (reproducible everywhere).
std::vector<int64_t> random_order(int64_t count, uint64_t seed);

// Perturbation curves: the model's output on copies of the image in which patches are blanked (set to 0 after
// normalisation, i.e. to the dataset mean) or, for insertion, restored onto an all-blank image, cumulatively in
// `order`, at given counts of patches. For each level: the probability of `target_class` and whether it is still
// the arg-max. auc: trapezoidal area under probability over the fraction of patches in [fractions.front(),
// fractions.back()].
struct PerturbationCurve {
  std::vector<double> fractions;  // blanked (or inserted) fraction of the patches at each level
  std::vector<double> probs;      // probability of the target class at that level
  std::vector<int> top1;          // 1 where the target class is still the arg-max
  double auc = 0.0;
};
using DeletionCurve = PerturbationCurve;

// counts: non-decreasing numbers of patches in [0, P]; insert = false blanks them, true restores them onto a blank
// image. Checks that order is a permutation prefix of valid patch indices as far as counts reach.
PerturbationCurve perturbation_curve(VisionTransformer& net, const torch::Tensor& image,
                                     const std::vector<int64_t>& order, const std::vector<int64_t>& counts,
                                     int64_t target_class, bool insert, int64_t batch_size = 16);

// Deletion (Petsiuk et al. 2018): `steps` + 1 evenly spaced counts round(i * P / steps) (steps capped at P), patches
// blanked most important first; lower AUC = the order found the evidence faster.
DeletionCurve deletion_curve(VisionTransformer& net, const torch::Tensor& image, const std::vector<int64_t>& order,
                             int64_t target_class, int64_t steps, int64_t batch_size = 16);
// Insertion: the same counts, patches restored onto a blank image most important first; higher AUC is better.
PerturbationCurve insertion_curve(VisionTransformer& net, const torch::Tensor& image,
                                  const std::vector<int64_t>& order, int64_t target_class, int64_t steps,
                                  int64_t batch_size = 16);
// Chefer et al.'s perturbation test: 0%, 10%, ..., 90% of the patches blanked (counts floor(f * P)) in `order`.
// Positive perturbation passes the most relevant first (lower AUC is better); negative perturbation passes the
// reversed order, least relevant first (higher AUC is better).
PerturbationCurve positive_perturbation(VisionTransformer& net, const torch::Tensor& image,
                                        const std::vector<int64_t>& order, int64_t target_class,
                                        int64_t batch_size = 16);
PerturbationCurve negative_perturbation(VisionTransformer& net, const torch::Tensor& image,
                                        const std::vector<int64_t>& order, int64_t target_class,
                                        int64_t batch_size = 16);

}  // namespace vit
