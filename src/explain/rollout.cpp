// Attention rollout, gradient rollout and deletion curves for export-attention; the formulas are in rollout.h.
#include "explain/rollout.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

namespace vit {
namespace {

// Checks a per-block stack of (nh, N, N) matrices: same shape in every block, N matching the grid.
void check_attentions(const std::vector<torch::Tensor>& attentions, int64_t prefix_tokens, int64_t grid_h,
                      int64_t grid_w, const char* what) {
  TORCH_CHECK(!attentions.empty(), what, ": no attention blocks given");
  const int64_t N = prefix_tokens + grid_h * grid_w;
  for (size_t b = 0; b < attentions.size(); ++b) {
    const auto& a = attentions[b];
    TORCH_CHECK(a.defined() && a.dim() == 3 && a.size(1) == N && a.size(2) == N, what, ": block ", b,
                " attention has shape ", a.defined() ? a.sizes() : c10::IntArrayRef{}, ", expected (nh, ", N, ", ",
                N, ") for ", prefix_tokens, " prefix token(s) and a ", grid_h, "x", grid_w, " grid");
  }
}

}  // namespace

void check_head_fusion(const std::string& fusion) {
  if (fusion != "mean" && fusion != "max" && fusion != "min") {
    throw std::invalid_argument("unknown head fusion \"" + fusion + "\" (allowed: mean, max, min)");
  }
}

torch::Tensor fuse_heads(const torch::Tensor& attention, const std::string& fusion, const torch::Tensor& keep) {
  check_head_fusion(fusion);
  TORCH_CHECK(attention.dim() == 3 && attention.size(1) == attention.size(2),
              "fuse_heads: attention must be (nh, N, N), got ", attention.sizes());
  auto heads = attention.to(torch::kCPU, torch::kFloat64);  // (nh, N, N)
  if (keep.defined()) {
    TORCH_CHECK(keep.dim() == 1 && keep.size(0) == heads.size(0), "fuse_heads: keep mask has shape ", keep.sizes(),
                ", expected (", heads.size(0), ")");
    const auto on = keep.to(torch::kCPU).nonzero().view(-1);  // indices of the heads that are on
    if (on.numel() == 0) return torch::zeros({heads.size(1), heads.size(2)}, torch::kFloat64);
    heads = heads.index_select(0, on);
  }
  if (fusion == "mean") return heads.mean(0);
  if (fusion == "max") return heads.amax(0);
  return heads.amin(0);
}

torch::Tensor discard_lowest(const torch::Tensor& fused, double ratio, int64_t prefix_tokens) {
  TORCH_CHECK(fused.dim() == 2 && fused.size(0) == fused.size(1), "discard_lowest: expected (N, N), got ",
              fused.sizes());
  if (!(ratio >= 0.0 && ratio < 1.0)) {
    throw std::invalid_argument("discard ratio " + std::to_string(ratio) + " is outside [0, 1)");
  }
  const int64_t N = fused.size(0);
  TORCH_CHECK(prefix_tokens >= 0 && prefix_tokens < N, "discard_lowest: ", prefix_tokens, " prefix tokens of ", N);
  auto out = fused.to(torch::kCPU, torch::kFloat64).clone();
  auto candidates = out.narrow(1, prefix_tokens, N - prefix_tokens).contiguous().view(-1);  // (N * (N - p))
  // The epsilon keeps floor() honest where ratio * count is an integer that binary fractions miss (0.29 * 100).
  const auto count = static_cast<int64_t>(std::floor(ratio * static_cast<double>(candidates.numel()) + 1e-9));
  if (count == 0) return out;
  // A stable ascending sort breaks ties by index, so the result never depends on topk's tie order.
  const auto order = std::get<1>(torch::sort(candidates, /*stable=*/true, /*dim=*/0, /*descending=*/false));
  candidates.index_fill_(0, order.narrow(0, 0, count), 0.0);
  out.narrow(1, prefix_tokens, N - prefix_tokens).copy_(candidates.view({N, N - prefix_tokens}));
  return out;
}

torch::Tensor add_identity_and_normalise(const torch::Tensor& fused) {
  TORCH_CHECK(fused.dim() == 2 && fused.size(0) == fused.size(1), "add_identity_and_normalise: expected (N, N), got ",
              fused.sizes());
  auto a = fused.to(torch::kFloat64) + torch::eye(fused.size(0), torch::kFloat64);  // (N, N)
  return a / a.sum(-1, /*keepdim=*/true);  // every row sums to 1 (jacobgil's version forgot keepdim)
}

torch::Tensor head_readout(const ModelConfig& model, const torch::Tensor& pool_attention) {
  const int64_t prefix = model.num_prefix_tokens();
  const int64_t patches = model.grid_h() * model.grid_w();
  if (model.global_pool == GlobalPool::map) {
    TORCH_CHECK(pool_attention.defined(), "head_readout: a MAP head needs its pooling attention");
    const auto a = pool_attention.to(torch::kCPU, torch::kFloat64);
    const auto per_patch = a.reshape({a.size(0), -1}).mean(0);  // (Np), or (N) over the prefix tokens too
    if (model.pool_includes_prefix()) return per_patch;
    auto readout = torch::zeros({prefix + per_patch.size(0)}, torch::kFloat64);
    readout.narrow(0, prefix, per_patch.size(0)).copy_(per_patch);
    return readout;
  }
  const auto tokens = pool_attention.defined() ? prefix + pool_attention.size(-1) : prefix + patches;
  auto readout = torch::zeros({tokens}, torch::kFloat64);
  // Token pooling reads the class token; average pooling reads the patches only, class token or not.
  if (model.global_pool == GlobalPool::token && model.class_token) {
    readout[0] = 1.0;
  } else {
    readout.narrow(0, prefix, tokens - prefix).fill_(1.0 / static_cast<double>(tokens - prefix));
  }
  return readout;
}

std::string head_readout_name(const ModelConfig& model) {
  if (model.global_pool == GlobalPool::map) {
    return std::string("the MAP head's pooling attention over the ") +
           (model.pool_includes_prefix() ? "tokens" : "patches") + " (head mean)";
  }
  if (model.global_pool == GlobalPool::token && model.class_token) return "the class token's row";
  return "the mean of the patch rows (the head averages the patch tokens)";
}

torch::Tensor rollout_to_map(const torch::Tensor& rollout, int64_t prefix_tokens, int64_t grid_h, int64_t grid_w,
                             const torch::Tensor& readout) {
  const int64_t patches = grid_h * grid_w;
  TORCH_CHECK(rollout.dim() == 2 && rollout.size(0) == prefix_tokens + patches &&
                  rollout.size(1) == prefix_tokens + patches,
              "rollout_to_map: matrix has shape ", rollout.sizes(), ", expected (", prefix_tokens + patches, ", ",
              prefix_tokens + patches, ") for ", prefix_tokens, " prefix token(s) and a ", grid_h, "x", grid_w,
              " grid");
  const auto r = rollout.to(torch::kFloat64);
  TORCH_CHECK(!readout.defined() || readout.numel() == r.size(0), "rollout_to_map: readout has ", readout.numel(),
              " weights for ", r.size(0), " tokens");
  const auto row = readout.defined() ? torch::matmul(readout.to(torch::kCPU, torch::kFloat64), r)
                                     : (prefix_tokens > 0 ? r[0] : r.mean(0));  // (N)
  auto map = row.narrow(0, prefix_tokens, patches).reshape({grid_h, grid_w}).clone();  // (gh, gw), row-major
  const double peak = map.max().item<double>();
  if (peak > 0.0) map /= peak;
  else map.zero_();
  return map.to(torch::kFloat32);
}

torch::Tensor attention_rollout(const std::vector<torch::Tensor>& attentions, const std::string& fusion,
                                double discard_ratio, int64_t prefix_tokens, int64_t grid_h, int64_t grid_w,
                                const std::vector<torch::Tensor>& head_keep, const torch::Tensor& readout) {
  check_head_fusion(fusion);
  check_attentions(attentions, prefix_tokens, grid_h, grid_w, "attention_rollout");
  TORCH_CHECK(head_keep.empty() || head_keep.size() == attentions.size(), "attention_rollout: ", head_keep.size(),
              " head masks for ", attentions.size(), " blocks");
  const int64_t N = prefix_tokens + grid_h * grid_w;
  auto result = torch::eye(N, torch::kFloat64);  // (N, N)
  for (size_t b = 0; b < attentions.size(); ++b) {
    auto fused = fuse_heads(attentions[b], fusion, head_keep.empty() ? torch::Tensor() : head_keep[b]);
    fused = discard_lowest(fused, discard_ratio, prefix_tokens);
    result = torch::matmul(add_identity_and_normalise(fused), result);  // later blocks on the left
  }
  return rollout_to_map(result, prefix_tokens, grid_h, grid_w, readout);
}

torch::Tensor gradient_rollout(const std::vector<torch::Tensor>& attentions,
                               const std::vector<torch::Tensor>& gradients, double discard_ratio,
                               int64_t prefix_tokens, int64_t grid_h, int64_t grid_w, const torch::Tensor& readout) {
  check_attentions(attentions, prefix_tokens, grid_h, grid_w, "gradient_rollout");
  TORCH_CHECK(gradients.size() == attentions.size(), "gradient_rollout: ", gradients.size(), " gradients for ",
              attentions.size(), " blocks");
  const int64_t N = prefix_tokens + grid_h * grid_w;
  auto result = torch::eye(N, torch::kFloat64);  // (N, N)
  for (size_t b = 0; b < attentions.size(); ++b) {
    TORCH_CHECK(gradients[b].defined() && gradients[b].sizes() == attentions[b].sizes(), "gradient_rollout: block ",
                b, " gradient has shape ", gradients[b].defined() ? gradients[b].sizes() : c10::IntArrayRef{},
                ", attention ", attentions[b].sizes());
    const auto weighted = attentions[b].to(torch::kCPU, torch::kFloat64) *
                          gradients[b].to(torch::kCPU, torch::kFloat64).clamp_min(0.0);  // (nh, N, N)
    auto fused = discard_lowest(weighted.mean(0), discard_ratio, prefix_tokens);           // (N, N)
    result = torch::matmul(add_identity_and_normalise(fused), result);
  }
  return rollout_to_map(result, prefix_tokens, grid_h, grid_w, readout);
}

torch::Tensor transformer_attribution(const std::vector<torch::Tensor>& attentions,
                                      const std::vector<torch::Tensor>& gradients, int64_t start_layer,
                                      int64_t prefix_tokens, int64_t grid_h, int64_t grid_w,
                                      const torch::Tensor& readout) {
  check_attentions(attentions, prefix_tokens, grid_h, grid_w, "transformer_attribution");
  TORCH_CHECK(gradients.size() == attentions.size(), "transformer_attribution: ", gradients.size(),
              " gradients for ", attentions.size(), " blocks");
  const auto depth = static_cast<int64_t>(attentions.size());
  if (start_layer < 0 || start_layer >= depth) {
    throw std::invalid_argument("--start-layer " + std::to_string(start_layer) + " is out of range [0, " +
                                std::to_string(depth) + ")");
  }
  const int64_t N = prefix_tokens + grid_h * grid_w;
  auto relevance = torch::eye(N, torch::kFloat64);  // (N, N)
  for (int64_t b = start_layer; b < depth; ++b) {
    TORCH_CHECK(gradients[b].defined() && gradients[b].sizes() == attentions[b].sizes(),
                "transformer_attribution: block ", b, " gradient has shape ",
                gradients[b].defined() ? gradients[b].sizes() : c10::IntArrayRef{}, ", attention ",
                attentions[b].sizes());
    const auto cam = (gradients[b].to(torch::kCPU, torch::kFloat64) * attentions[b].to(torch::kCPU, torch::kFloat64))
                         .clamp_min(0.0)
                         .mean(0);                         // (N, N): each head clamped, then averaged
    relevance = relevance + torch::matmul(cam, relevance);  // R = R + Abar @ R
  }
  return rollout_to_map(relevance, prefix_tokens, grid_h, grid_w, readout);
}

torch::Tensor attention_gradcam(const torch::Tensor& attention, const torch::Tensor& gradient, int64_t prefix_tokens,
                                int64_t grid_h, int64_t grid_w, const torch::Tensor& readout) {
  check_attentions({attention}, prefix_tokens, grid_h, grid_w, "attention_gradcam");
  TORCH_CHECK(gradient.defined() && gradient.sizes() == attention.sizes(), "attention_gradcam: gradient has shape ",
              gradient.defined() ? gradient.sizes() : c10::IntArrayRef{}, ", attention ", attention.sizes());
  const int64_t patches = grid_h * grid_w;
  const auto a = attention.to(torch::kCPU, torch::kFloat64), g = gradient.to(torch::kCPU, torch::kFloat64);
  TORCH_CHECK(!readout.defined() || readout.numel() == a.size(1), "attention_gradcam: readout has ", readout.numel(),
              " weights for ", a.size(1), " tokens");
  // The readout's row of every head: (nh, N). Without a readout, the class token's row (or the mean of all rows).
  auto row = [&](const torch::Tensor& t) {
    return readout.defined() ? torch::matmul(readout.to(torch::kCPU, torch::kFloat64), t)
                             : (prefix_tokens > 0 ? t.select(1, 0) : t.mean(1));
  };
  const auto rows = row(a).narrow(1, prefix_tokens, patches);                       // (nh, P)
  const auto weights = row(g).narrow(1, prefix_tokens, patches).mean(1, true);      // (nh, 1)
  auto map = (weights * rows).mean(0).clamp_min(0.0).reshape({grid_h, grid_w}).clone();  // (gh, gw)
  const double peak = map.max().item<double>();
  if (peak > 0.0) map /= peak;
  else map.zero_();
  return map.to(torch::kFloat32);
}

torch::Tensor class_attention_maps(const torch::Tensor& attention, int64_t prefix_tokens, int64_t grid_h,
                                   int64_t grid_w, const torch::Tensor& readout) {
  check_attentions({attention}, prefix_tokens, grid_h, grid_w, "class_attention_maps");
  const int64_t nh = attention.size(0), patches = grid_h * grid_w;
  const auto a = attention.to(torch::kCPU, torch::kFloat64);  // (nh, N, N)
  TORCH_CHECK(!readout.defined() || readout.numel() == a.size(1), "class_attention_maps: readout has ",
              readout.numel(), " weights for ", a.size(1), " tokens");
  const auto rows = readout.defined() ? torch::matmul(readout.to(torch::kCPU, torch::kFloat64), a)  // (nh, N)
                                      : (prefix_tokens > 0 ? a.select(1, 0) : a.mean(1));  // the class token's queries
  auto maps = rows.narrow(1, prefix_tokens, patches).clone();           // (nh, gh*gw)
  const auto peak = maps.amax(1, /*keepdim=*/true);                     // (nh, 1)
  maps = torch::where(peak > 0, maps / peak.clamp_min(1e-300), torch::zeros_like(maps));
  return maps.view({nh, grid_h, grid_w}).to(torch::kFloat32);
}

torch::Tensor class_attention_mean(const torch::Tensor& attention, int64_t prefix_tokens, int64_t grid_h,
                                   int64_t grid_w, const torch::Tensor& keep, const torch::Tensor& readout) {
  check_attentions({attention}, prefix_tokens, grid_h, grid_w, "class_attention_mean");
  // A block with every head off still gets a picture: the mean over all of them.
  const bool any_on = keep.defined() && keep.to(torch::kCPU).count_nonzero().item<int64_t>() > 0;
  return rollout_to_map(fuse_heads(attention, "mean", any_on ? keep : torch::Tensor()), prefix_tokens, grid_h,
                        grid_w, readout);
}

std::vector<torch::Tensor> head_keep_masks(VisionTransformer& net) {
  std::vector<torch::Tensor> masks;
  for (const auto& module : *net->blocks) {
    const auto& attn = module->as<Block>()->attn;
    masks.push_back(attn->head_mask.defined() ? attn->head_mask.to(torch::kCPU, torch::kFloat32)
                                              : torch::ones({attn->num_heads}));
  }
  return masks;
}

AttentionCapture capture_attention(VisionTransformer& net, const torch::Tensor& image, int64_t gradient_class) {
  TORCH_CHECK(image.dim() == 3, "capture_attention: expected one image (C, H, W), got ", image.sizes());
  const auto device = net->device();
  const bool want_gradients = gradient_class != -1;
  // Gradients need the graph; without them no graph is built at all.
  torch::AutoGradMode grad_mode(want_gradients);
  Capture capture;
  capture.attention = true;  // explicit attention: the model never uses a fused kernel when probabilities are kept
  const auto x = image.unsqueeze(0).to(device, torch::kFloat32);                 // (1, C, H, W)
  const auto logits = net->forward_head(net->forward_features(x, {}, &capture), false, &capture);  // (1, K)

  AttentionCapture out;
  out.logits = logits[0].detach().to(torch::kCPU, torch::kFloat32);
  if (capture.pool_attention.defined()) out.pool_attention = capture.pool_attention[0].detach().to(torch::kCPU, torch::kFloat32);
  for (const auto& probs : capture.attention_probs) {
    out.attentions.push_back(probs[0].detach().to(torch::kCPU, torch::kFloat32));  // (nh, N, N)
  }
  if (!want_gradients) return out;

  const int64_t K = logits.size(1);
  const int64_t target = gradient_class == kPredictedClass ? out.logits.argmax().item<int64_t>() : gradient_class;
  if (target < 0 || target >= K) {
    throw std::invalid_argument("gradient class " + std::to_string(target) + " is out of range [0, " +
                                std::to_string(K) + ")");
  }
  const auto grads = torch::autograd::grad({logits[0][target]}, capture.attention_probs, /*grad_outputs=*/{},
                                           /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
  for (size_t b = 0; b < grads.size(); ++b) {
    // A block the score does not reach (none in a ViT, but allowed) has gradient zero.
    out.gradients.push_back(grads[b].defined() ? grads[b][0].detach().to(torch::kCPU, torch::kFloat32)
                                               : torch::zeros_like(out.attentions[b]));
  }
  out.gradient_class = target;
  return out;
}

std::vector<int64_t> importance_order(const torch::Tensor& heat) {
  const auto flat = heat.to(torch::kCPU, torch::kFloat64).reshape(-1);
  const auto order = std::get<1>(torch::sort(flat, /*stable=*/true, /*dim=*/0, /*descending=*/true)).contiguous();
  return std::vector<int64_t>(order.data_ptr<int64_t>(), order.data_ptr<int64_t>() + order.numel());
}

std::vector<int64_t> random_order(int64_t count, uint64_t seed) {
  std::vector<int64_t> order(count);
  for (int64_t i = 0; i < count; ++i) order[i] = i;
  // Fisher-Yates with our own index draw: std::shuffle's draws differ between standard libraries.
  std::mt19937_64 generator(seed);
  for (int64_t i = count - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(generator() % static_cast<uint64_t>(i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

PerturbationCurve perturbation_curve(VisionTransformer& net, const torch::Tensor& image,
                                     const std::vector<int64_t>& order, const std::vector<int64_t>& counts,
                                     int64_t target_class, bool insert, int64_t batch_size) {
  TORCH_CHECK(image.dim() == 3, "perturbation_curve: expected one image (C, H, W), got ", image.sizes());
  const int64_t P = net->config().patch_size;
  const int64_t grid_h = image.size(1) / P, grid_w = image.size(2) / P, patches = grid_h * grid_w;
  TORCH_CHECK(static_cast<int64_t>(order.size()) == patches, "perturbation_curve: order has ", order.size(),
              " entries for a ", grid_h, "x", grid_w, " grid");
  TORCH_CHECK(!counts.empty() && batch_size >= 1, "perturbation_curve: no levels, or batch size ", batch_size);

  // Levels are cumulative, so each one is the previous one with a few more patches changed.
  const auto original = image.to(torch::kCPU, torch::kFloat32);
  auto current = insert ? torch::zeros_like(original) : original.clone();  // (C, H, W)
  std::vector<torch::Tensor> levels;
  PerturbationCurve curve;
  int64_t done = 0;
  for (const int64_t count : counts) {
    TORCH_CHECK(count >= done && count <= patches, "perturbation_curve: counts must be non-decreasing in [0, ",
                patches, "], got ", count, " after ", done);
    for (; done < count; ++done) {
      const int64_t p = order[done];
      TORCH_CHECK(p >= 0 && p < patches, "perturbation_curve: patch index ", p, " outside [0, ", patches, ")");
      auto cell = current.narrow(1, (p / grid_w) * P, P).narrow(2, (p % grid_w) * P, P);
      if (insert) cell.copy_(original.narrow(1, (p / grid_w) * P, P).narrow(2, (p % grid_w) * P, P));
      else cell.zero_();
    }
    levels.push_back(current.clone());
    curve.fractions.push_back(static_cast<double>(count) / patches);
  }

  torch::NoGradGuard no_grad;
  const auto device = net->device();
  for (size_t start = 0; start < levels.size(); start += batch_size) {
    const size_t end = std::min(levels.size(), start + static_cast<size_t>(batch_size));
    const auto batch = torch::stack(std::vector<torch::Tensor>(levels.begin() + start, levels.begin() + end));
    const auto probs = net->forward(batch.to(device)).softmax(-1).to(torch::kCPU, torch::kFloat64);  // (b, K)
    TORCH_CHECK(target_class >= 0 && target_class < probs.size(1), "perturbation_curve: class ", target_class,
                " outside [0, ", probs.size(1), ")");
    const auto best = probs.argmax(1);
    for (int64_t r = 0; r < probs.size(0); ++r) {
      curve.probs.push_back(probs[r][target_class].item<double>());
      curve.top1.push_back(best[r].item<int64_t>() == target_class ? 1 : 0);
    }
  }
  for (size_t i = 1; i < curve.probs.size(); ++i) {
    curve.auc += (curve.fractions[i] - curve.fractions[i - 1]) * 0.5 * (curve.probs[i] + curve.probs[i - 1]);
  }
  return curve;
}

namespace {

std::vector<int64_t> even_counts(int64_t patches, int64_t steps) {
  TORCH_CHECK(steps >= 1, "deletion/insertion: steps ", steps, " must be positive");
  steps = std::min(steps, patches);
  std::vector<int64_t> counts;
  for (int64_t i = 0; i <= steps; ++i) {
    counts.push_back(static_cast<int64_t>(std::llround(static_cast<double>(i) * patches / steps)));
  }
  return counts;
}

// 0%, 10%, ..., 90% of the patches, rounded down as Chefer et al.'s int(fraction * size).
std::vector<int64_t> tenth_counts(int64_t patches) {
  std::vector<int64_t> counts;
  for (int64_t i = 0; i < 10; ++i) {
    counts.push_back(static_cast<int64_t>(std::floor(static_cast<double>(i * patches) / 10.0 + 1e-9)));
  }
  return counts;
}

}  // namespace

DeletionCurve deletion_curve(VisionTransformer& net, const torch::Tensor& image, const std::vector<int64_t>& order,
                             int64_t target_class, int64_t steps, int64_t batch_size) {
  return perturbation_curve(net, image, order, even_counts(static_cast<int64_t>(order.size()), steps), target_class,
                            /*insert=*/false, batch_size);
}

PerturbationCurve insertion_curve(VisionTransformer& net, const torch::Tensor& image,
                                  const std::vector<int64_t>& order, int64_t target_class, int64_t steps,
                                  int64_t batch_size) {
  return perturbation_curve(net, image, order, even_counts(static_cast<int64_t>(order.size()), steps), target_class,
                            /*insert=*/true, batch_size);
}

PerturbationCurve positive_perturbation(VisionTransformer& net, const torch::Tensor& image,
                                        const std::vector<int64_t>& order, int64_t target_class,
                                        int64_t batch_size) {
  return perturbation_curve(net, image, order, tenth_counts(static_cast<int64_t>(order.size())), target_class,
                            /*insert=*/false, batch_size);
}

PerturbationCurve negative_perturbation(VisionTransformer& net, const torch::Tensor& image,
                                        const std::vector<int64_t>& order, int64_t target_class,
                                        int64_t batch_size) {
  const std::vector<int64_t> reversed(order.rbegin(), order.rend());
  return perturbation_curve(net, image, reversed, tenth_counts(static_cast<int64_t>(order.size())), target_class,
                            /*insert=*/false, batch_size);
}

}  // namespace vit
