// The Vision Transformer's modules below the model, smallest first: linear layer, norm, patch embedding, attention,
// MLP, block, attention pooling (model/layers.h).
#include "model/layers.h"

#include <torch/version.h>

#include <mutex>
#include <set>
#include <stdexcept>

#include "model/cpu_kernels.h"
#include "model/fused_block.h"
#include "util/log.h"

namespace vit {

namespace {

// Stochastic depth's per-sample factors (B): 0 drops a sample's residual branch, 1 / keep rescales a survivor;
// undefined when off.
torch::Tensor drop_path_keep(int64_t batch, double p, bool training, const torch::TensorOptions& options) {
  if (p <= 0.0 || !training) return {};
  const double keep = 1.0 - p;
  return torch::empty({batch}, options).bernoulli_(keep).div_(keep);  // (B)
}

torch::Tensor drop_path(const torch::Tensor& x, double p, bool training) {
  const auto keep = drop_path_keep(x.size(0), p, training, x.options());
  if (!keep.defined()) return x;
  std::vector<int64_t> shape(x.dim(), 1);
  shape[0] = x.size(0);
  return x * keep.view(shape);  // (B, 1, 1)
}

// Says once per process why a model's blocks cannot take the fused CPU path.
void note_fused_fallback(const std::string& reason) {
  static std::mutex mutex;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mutex);
  if (said.insert(reason).second) {
    log::info("fused CPU block not used with " + reason + ": the blocks run operator by operator");
  }
}

}  // namespace

torch::Tensor causal_mask(int64_t tokens) {
  return torch::ones({tokens, tokens}, torch::kBool).tril();  // (N, N)
}

torch::Tensor key_padding_mask(const torch::Tensor& keep_tokens) {
  TORCH_CHECK(keep_tokens.dim() == 2, "key padding mask must be (B, N), got ", keep_tokens.sizes());
  return keep_tokens.to(torch::kBool).unsqueeze(1).unsqueeze(1);  // (B, 1, 1, N)
}

// ---- Linear ----

LinearImpl::LinearImpl(int64_t in_features, int64_t out_features, bool with_bias) {
  weight = register_parameter("weight", torch::empty({out_features, in_features}));
  if (with_bias) bias = register_parameter("bias", torch::empty({out_features}));
}

namespace {
// Whether a packed (reduced-precision) layer may take x: inference only, where it was packed (CPU float32).
bool takes_packed(const std::shared_ptr<PackedLinear>& packed, const torch::Tensor& x) {
  return packed && !torch::GradMode::is_enabled() && x.device().is_cpu() && x.scalar_type() == torch::kFloat;
}
}  // namespace

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  if (takes_packed(packed, x)) return packed->forward(x);
  return linear(x, weight, bias);
}

// ---- Norm ----

NormImpl::NormImpl(int64_t dim, NormLayer kind, double eps) : kind(kind), eps(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
  if (kind == NormLayer::layernorm) bias = register_parameter("bias", torch::zeros({dim}));
}

torch::Tensor NormImpl::forward(const torch::Tensor& x) {
  if (kind == NormLayer::layernorm) return torch::layer_norm(x, {weight.size(0)}, weight, bias, eps);
  // timm's RmsNorm (F.rms_norm): x / sqrt(mean(x^2) + eps), then the weight; in float32 for half inputs.
  const auto x32 = x.to(torch::kFloat);
  return (x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps)).to(x.dtype()) * weight.to(x.dtype());
}

Norm make_norm(const ModelConfig& config, int64_t dim) { return Norm(dim, config.norm_layer, config.layer_norm_eps); }

// ---- PatchEmbed ----

PatchEmbedImpl::PatchEmbedImpl(const ModelConfig& config) : patch_size(config.patch_size) {
  proj = register_module(
      "proj", torch::nn::Conv2d(torch::nn::Conv2dOptions(config.in_chans, config.embed_dim, config.patch_size)
                                    .stride(config.patch_size)
                                    .bias(!config.pre_norm)));
  if (config.embed_norm_layer) {
    norm = register_module("norm", Norm(config.embed_dim, *config.embed_norm_layer, config.layer_norm_eps));
  }
}

torch::Tensor PatchEmbedImpl::forward(const torch::Tensor& x) {
  auto tokens = project(x);  // (B, gh*gw, D)
  return norm ? norm->forward(tokens) : tokens;
}

torch::Tensor PatchEmbedImpl::project(const torch::Tensor& x) {
  if (x.device().is_cpu()) {
    // A stride-P P x P convolution is a linear layer over the flattened patches: on the CPU that goes through the
    // fast sgemm instead of im2col plus the reference BLAS (the conv weight (D, C, P, P) is viewed as (D, C*P*P)).
    const int64_t B = x.size(0), C = x.size(1), P = patch_size;
    const int64_t gh = x.size(2) / P, gw = x.size(3) / P;  // a remainder is dropped, as the convolution drops it
    auto patches = x.narrow(2, 0, gh * P)
                       .narrow(3, 0, gw * P)
                       .reshape({B, C, gh, P, gw, P})
                       .permute({0, 2, 4, 1, 3, 5})
                       .reshape({B, gh * gw, C * P * P});  // (B, gh*gw, C*P*P), rows of patches in (c, y, x) order
    if (takes_packed(packed, patches)) return packed->forward(patches);
    return linear(patches, proj->weight.view({proj->weight.size(0), C * P * P}), proj->bias);
  }
  auto y = proj->forward(x);            // (B, D, gh, gw)
  return y.flatten(2).transpose(1, 2);  // (B, gh*gw, D), row by row
}

// ---- relative position bias ----

torch::Tensor relative_position_index(int64_t trained_h, int64_t trained_w, int64_t grid_h, int64_t grid_w,
                                      int64_t prefix_tokens) {
  const int64_t span_w = 2 * trained_w - 1;
  const int64_t patch_entries = (2 * trained_h - 1) * span_w;
  const int64_t patches = grid_h * grid_w;
  const int64_t prefix = prefix_tokens;
  const int64_t tokens = patches + prefix;
  auto index = torch::empty({tokens, tokens}, torch::kInt64);
  auto acc = index.accessor<int64_t, 2>();
  for (int64_t i = 0; i < patches; ++i) {
    const int64_t yi = i / grid_w, xi = i % grid_w;
    for (int64_t j = 0; j < patches; ++j) {
      const int64_t yj = j / grid_w, xj = j % grid_w;
      const int64_t dy = std::clamp<int64_t>(yi - yj, -(trained_h - 1), trained_h - 1) + trained_h - 1;
      const int64_t dx = std::clamp<int64_t>(xi - xj, -(trained_w - 1), trained_w - 1) + trained_w - 1;
      acc[i + prefix][j + prefix] = dy * span_w + dx;
    }
  }
  for (int64_t i = 0; i < prefix; ++i) {
    for (int64_t t = prefix; t < tokens; ++t) {
      acc[i][t] = patch_entries;      // prefix -> patch
      acc[t][i] = patch_entries + 1;  // patch -> prefix
    }
    for (int64_t j = 0; j < prefix; ++j) acc[i][j] = patch_entries + 2;  // prefix -> prefix
  }
  return index;
}

// ---- Attention ----

bool sdpa_available() { return TORCH_VERSION_MAJOR >= 2; }

AttentionImpl::AttentionImpl(const ModelConfig& config, int64_t layer)
    : num_heads(config.num_heads),
      head_dim(config.head_dim()),
      num_kv_heads(config.kv_heads(layer)),
      scale(1.0 / std::sqrt(static_cast<double>(config.head_dim()))),
      trained_grid{config.grid_h(), config.grid_w()},
      prefix_tokens(config.num_prefix_tokens()),
      attn_drop(config.attn_drop_rate),
      proj_drop(config.proj_drop_rate) {
  const int64_t dim = config.embed_dim;
  const bool eva = config.model_class == ModelClass::eva;
  if (config.qkv_fused) {
    qkv = register_module("qkv", Linear(dim, 3 * dim, config.qkv_bias && !config.eva_qkv_bias()));
    if (config.eva_qkv_bias()) {
      q_bias = register_parameter("q_bias", torch::zeros({dim}));
      v_bias = register_parameter("v_bias", torch::zeros({dim}));
    }
  } else {
    // EvaAttention's k_proj has no bias; AttentionRope's has qkv_bias's.
    const int64_t kv_dim = num_kv_heads * head_dim;
    q_proj = register_module("q_proj", Linear(dim, dim, config.qkv_bias));
    k_proj =
        register_module("k_proj", Linear(dim, kv_dim, config.qkv_bias && !(eva && config.attn_type == AttnType::eva)));
    v_proj = register_module("v_proj", Linear(dim, kv_dim, config.qkv_bias));
  }
  if (config.qk_norm) {
    q_norm = register_module("q_norm", make_norm(config, head_dim));
    k_norm = register_module("k_norm", make_norm(config, head_dim));
  }
  if (config.scale_attn_inner) norm = register_module("norm", make_norm(config, dim));
  rope_rotate_half = config.rope_rotate_half;
  proj = register_module("proj", Linear(dim, dim, config.proj_bias));
  if (config.rel_pos_bias) {
    const int64_t entries = (2 * trained_grid[0] - 1) * (2 * trained_grid[1] - 1) + (prefix_tokens > 0 ? 3 : 0);
    relative_position_bias_table =
        register_parameter("relative_position_bias_table", torch::zeros({entries, num_heads}));
  }
}

torch::Tensor AttentionImpl::relative_bias(std::array<int64_t, 2> grid) {
  if (!relative_position_bias_table.defined()) return {};
  auto index = relative_position_index(trained_grid[0], trained_grid[1], grid[0], grid[1], prefix_tokens)
                   .to(relative_position_bias_table.device());
  const int64_t tokens = index.size(0);
  auto bias = relative_position_bias_table.index_select(0, index.view(-1));  // (N*N, nh)
  return bias.view({tokens, tokens, num_heads}).permute({2, 0, 1});          // (nh, N, N)
}

torch::Tensor AttentionImpl::qkv_bias() const {
  if (!q_bias.defined()) return qkv->bias;
  return torch::cat({q_bias, torch::zeros_like(q_bias), v_bias});  // (3D), as EvaAttention's
}

torch::Tensor AttentionImpl::project_qkv(const torch::Tensor& x) {
  if (!qkv) return torch::cat({q_proj->forward(x), k_proj->forward(x), v_proj->forward(x)}, -1);
  if (!q_bias.defined()) return qkv->forward(x);
  const auto bias = qkv_bias();
  if (qkv->packed && !torch::GradMode::is_enabled()) return qkv->forward(x) + bias;  // reduced precision
  return linear(x, qkv->weight, bias);
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, std::array<int64_t, 2> grid, const torch::Tensor& mask,
                                     torch::Tensor* probs_out, const torch::Tensor& rope) {
  const int64_t B = x.size(0), N = x.size(1), D = x.size(2);
  const bool grouped = num_kv_heads != num_heads;
  const auto fused = grouped ? torch::Tensor() : project_qkv(x);  // (B, N, 3D)
  const bool dropping = is_training() && attn_drop > 0.0;
  const bool plain = !mask.defined() && !relative_position_bias_table.defined() && !dropping && !head_mask.defined() &&
                     !q_norm && !norm && !rope.defined() && !grouped;
  if (kernel == AttentionKernel::automatic && !sdpa_available() && plain && probs_out == nullptr &&
      attention_core_applies(fused)) {
    // CPU float32: q, k, v read in place from the fused projection, heads in parallel (model/cpu_kernels.h).
    auto merged = proj->forward(attention_core(fused, num_heads, scale));  // (B, N, D)
    if (proj_drop > 0.0 && is_training()) merged = torch::dropout(merged, /*p=*/proj_drop, /*train=*/true);
    return merged;
  }
  if (kernel == AttentionKernel::sdpa && !sdpa_available()) {
    throw std::invalid_argument(
        "attention kernel sdpa needs LibTorch >= 2.0; this vit is built against " TORCH_VERSION);
  }
  torch::Tensor q, k, v;  // (B, nh, N, hd) each; k and v (B, nkv, N, hd) with grouped-query attention
  if (grouped) {
    q = q_proj->forward(x).view({B, N, num_heads, head_dim}).transpose(1, 2);
    k = k_proj->forward(x).view({B, N, num_kv_heads, head_dim}).transpose(1, 2);
    v = v_proj->forward(x).view({B, N, num_kv_heads, head_dim}).transpose(1, 2);
  } else {
    auto qkv_out = fused.reshape({B, N, 3, num_heads, head_dim}).permute({2, 0, 3, 1, 4});  // (3, B, nh, N, hd)
    q = qkv_out[0], k = qkv_out[1], v = qkv_out[2];
  }
  if (q_norm) q = q_norm->forward(q), k = k_norm->forward(k);
  if (rope.defined()) {
    // The patch tokens' queries and keys rotated by their positions; the prefix tokens' pass as they are.
    q = apply_rope(q, rope.to(q.device()), prefix_tokens, rope_rotate_half);
    k = apply_rope(k, rope.to(k.device()), prefix_tokens, rope_rotate_half);
  }
  if (grouped) {
    // Each key/value head serves num_heads / num_kv_heads query heads in a row (head h reads kv head h / groups),
    // after the norms and the rotation, as timm's AttentionRope.
    k = k.repeat_interleave(num_heads / num_kv_heads, 1);  // (B, nh, N, hd)
    v = v.repeat_interleave(num_heads / num_kv_heads, 1);
  }
  const auto bias = relative_bias(grid);  // (nh, N, N) or undefined

  torch::Tensor out;  // (B, nh, N, hd)
#if TORCH_VERSION_MAJOR >= 2
  if (kernel != AttentionKernel::explicit_softmax && probs_out == nullptr) {
    // Fused kernels (flash / memory-efficient) never materialise the probabilities, so only here. Its default scale
    // is 1/sqrt(hd), the model's.
    // bool (true = attend) or additive, broadcastable to (B, nh, N, N); none at all, not an undefined tensor, when
    // there is no mask (2.x rejects an undefined one).
    std::optional<torch::Tensor> attn_mask;
    if (mask.defined()) attn_mask = mask;
    if (bias.defined()) {
      auto additive = bias.unsqueeze(0).to(q.dtype());  // (1, nh, N, N)
      if (mask.defined()) additive = additive.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity());
      attn_mask = additive;
    }
    out = at::scaled_dot_product_attention(q, k, v, attn_mask, /*dropout_p=*/dropping ? attn_drop : 0.0,
                                           /*is_causal=*/false);
  } else
#endif
  {
    // Same order as timm's explicit path: scale q, q @ k^T, softmax over keys.
    auto logits = torch::matmul(q * scale, k.transpose(-2, -1));  // (B, nh, N, N)
    if (bias.defined()) logits = logits + bias.unsqueeze(0).to(logits.dtype());
    if (mask.defined()) logits = logits.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity());
    auto probs = logits.softmax(-1);
    if (probs_out != nullptr) *probs_out = probs;
    if (dropping) probs = torch::dropout(probs, /*p=*/attn_drop, /*train=*/true);
    out = torch::matmul(probs, v);  // (B, nh, N, hd)
  }
  if (head_mask.defined()) out = out * head_mask.to(out.dtype()).view({1, num_heads, 1, 1});
  auto merged = out.transpose(1, 2).reshape({B, N, D});  // (B, N, D), heads concatenated
  if (norm) merged = norm->forward(merged);
  merged = proj->forward(merged);
  if (proj_drop > 0.0 && is_training()) merged = torch::dropout(merged, /*p=*/proj_drop, /*train=*/true);
  return merged;
}

// ---- Mlp, LayerScale, Block ----

torch::Tensor activation(const torch::Tensor& x, Activation act) {
  switch (act) {
    case Activation::gelu:
      return torch::gelu(x);  // exact (erf) GELU, as timm's nn.GELU
    case Activation::quick_gelu:
      return x * torch::sigmoid(1.702 * x);  // timm's quick_gelu (OpenAI CLIP)
    case Activation::gelu_tanh:
      return torch::gelu(x, "tanh");
    case Activation::silu:
      return torch::silu(x);
  }
  throw std::logic_error("unknown activation");
}

MlpImpl::MlpImpl(int64_t dim, int64_t hidden, double drop, Activation act, MlpKind kind, bool bias, Norm inner_norm)
    : drop(drop), act(act), kind(kind) {
  if (kind == MlpKind::swiglu_split) {
    fc1_g = register_module("fc1_g", Linear(dim, hidden, bias));
    fc1_x = register_module("fc1_x", Linear(dim, hidden, bias));
  } else {
    fc1 = register_module("fc1", Linear(dim, kind == MlpKind::swiglu_packed ? 2 * hidden : hidden, bias));
  }
  if (inner_norm) norm = register_module("norm", inner_norm);
  fc2 = register_module("fc2", Linear(hidden, dim, bias));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  torch::Tensor h;
  switch (kind) {
    case MlpKind::plain:
      h = activation(fc1->forward(x), act);
      break;
    case MlpKind::swiglu_packed: {
      const auto parts = fc1->forward(x).chunk(2, -1);  // gate rows first (timm's GluMlp, gate_last false)
      h = activation(parts[0], act) * parts[1];
      break;
    }
    case MlpKind::swiglu_split:
      h = activation(fc1_g->forward(x), act) * fc1_x->forward(x);
      break;
  }
  if (drop > 0.0 && is_training()) h = torch::dropout(h, /*p=*/drop, /*train=*/true);
  if (norm) h = norm->forward(h);
  h = fc2->forward(h);
  if (drop > 0.0 && is_training()) h = torch::dropout(h, /*p=*/drop, /*train=*/true);
  return h;
}

LayerScaleImpl::LayerScaleImpl(int64_t dim, double init_value) {
  gamma = register_parameter("gamma", torch::full({dim}, init_value));
}

BlockImpl::BlockImpl(const ModelConfig& config, double drop_path_rate, int64_t layer) : drop_path_rate(drop_path_rate) {
  const int64_t dim = config.embed_dim;
  const bool eva = config.model_class == ModelClass::eva;
  norm1 = register_module("norm1", make_norm(config, dim));
  attn = register_module("attn", Attention(config, layer));
  if (config.init_values && !eva) ls1 = register_module("ls1", LayerScale(dim, *config.init_values));
  if (config.init_values && eva) gamma_1 = register_parameter("gamma_1", torch::full({dim}, *config.init_values));
  norm2 = register_module("norm2", make_norm(config, dim));
  const MlpKind kind = !config.gated_mlp()     ? MlpKind::plain
                       : config.swiglu_split() ? MlpKind::swiglu_split
                                               : MlpKind::swiglu_packed;
  mlp = register_module(
      "mlp", Mlp(dim, config.mlp_hidden(), config.proj_drop_rate, config.gate_activation(), kind, config.proj_bias,
                 config.scale_mlp ? make_norm(config, config.mlp_hidden()) : nullptr));
  if (config.init_values && !eva) ls2 = register_module("ls2", LayerScale(dim, *config.init_values));
  if (config.init_values && eva && !config.attn_only_layer_scale) {
    gamma_2 = register_parameter("gamma_2", torch::full({dim}, *config.init_values));
  }
  post_norm = config.use_post_norm;
}

std::string BlockImpl::fused_refusal() const {
  if (post_norm) return "use_post_norm";
  if (mlp->norm) return "scale_mlp";
  if (attn->norm) return "scale_attn_inner";
  if (!attn->qkv) return "separate q_proj / k_proj / v_proj (qkv_fused false)";
  if (attn->q_norm) return "qk_norm";
  if (attn->relative_position_bias_table.defined()) return "rel_pos_bias";
  if (is_training() && (attn->attn_drop > 0.0 || attn->proj_drop > 0.0)) {
    return "attn_drop_rate or proj_drop_rate in training";
  }
  return {};
}

BlockParameters BlockImpl::fused_parameters(const torch::Tensor& rope) const {
  BlockParameters p;
  p.norm1_weight = norm1->weight, p.norm1_bias = norm1->bias;
  p.qkv_weight = attn->qkv->weight, p.qkv_bias = attn->qkv_bias();
  p.proj_weight = attn->proj->weight, p.proj_bias = attn->proj->bias;
  p.gamma1 = ls1 ? ls1->gamma : gamma_1;
  p.norm2_weight = norm2->weight, p.norm2_bias = norm2->bias;
  p.fc2_weight = mlp->fc2->weight, p.fc2_bias = mlp->fc2->bias;
  p.gamma2 = ls2 ? ls2->gamma : gamma_2;
  p.rope = rope;
  p.packed = packed_products;
  const int64_t hidden = mlp->fc2->weight.size(1);
  auto half = [&](const torch::Tensor& t, int64_t part) {  // a packed fc1's gates (0) or values (1): rows
    return t.defined() ? t.narrow(0, part * hidden, hidden) : t;
  };
  switch (mlp->kind) {
    case MlpKind::plain:
      p.fc1_weight = mlp->fc1->weight, p.fc1_bias = mlp->fc1->bias;
      break;
    case MlpKind::swiglu_packed:
      p.fc1_weight = half(mlp->fc1->weight, 0), p.fc1_bias = half(mlp->fc1->bias, 0);
      p.fc1v_weight = half(mlp->fc1->weight, 1), p.fc1v_bias = half(mlp->fc1->bias, 1);
      break;
    case MlpKind::swiglu_split:
      p.fc1_weight = mlp->fc1_g->weight, p.fc1_bias = mlp->fc1_g->bias;
      p.fc1v_weight = mlp->fc1_x->weight, p.fc1v_bias = mlp->fc1_x->bias;
      break;
  }
  return p;
}

std::vector<std::shared_ptr<PackedLinear>> BlockImpl::int8_layers() const {
  if (torch::GradMode::is_enabled() || mlp->kind == MlpKind::swiglu_packed) return {};
  std::vector<std::shared_ptr<PackedLinear>> layers;
  for (const Linear& layer : {attn->qkv, attn->proj, mlp->fc1, mlp->fc1_g, mlp->fc1_x, mlp->fc2}) {
    if (!layer) continue;
    if (!layer->packed || layer->packed->precision() != Precision::int8) return {};
    layers.push_back(layer->packed);
  }
  return layers;
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, std::array<int64_t, 2> grid, const torch::Tensor& mask,
                                 torch::Tensor* probs_out, const torch::Tensor& rope) {
  // The fused CPU block where nothing asks for what it does not compute (probabilities, masks, head ablation, another
  // attention kernel) and the model's options are covered.
  if (fused && probs_out == nullptr && !mask.defined() && !attn->head_mask.defined() &&
      attn->kernel == AttentionKernel::automatic) {
    auto refusal = fused_refusal();
    if (refusal.empty() && rope.defined() && rope.requires_grad()) {
      refusal = "rope_type mixed with gradients (learned rope.freqs)";
    }
    // Packed layers: int8 ones run inside the fused block (without gradients); bf16 ones operator by operator.
    std::vector<std::shared_ptr<PackedLinear>> int8 = int8_layers();
    if (refusal.empty() && (!attn->qkv->packed || !int8.empty())) {
      BlockParameters parameters = fused_parameters(rope);
      parameters.int8 = std::move(int8);
      if (fused_block_applies(x, parameters)) {
        const int64_t B = x.size(0);
        // Drawn in the order the per-operator path draws them (after attention, after the MLP): same seed, same drops.
        const auto keep1 = drop_path_keep(B, drop_path_rate, is_training(), x.options());
        const auto keep2 = drop_path_keep(B, drop_path_rate, is_training(), x.options());
        BlockShape shape{attn->num_heads,     attn->scale,           norm1->eps, mlp->act, norm1->kind,
                         attn->prefix_tokens, attn->rope_rotate_half};
        shape.bf16 = bf16_products;
        return fused_block(x, parameters, shape, keep1, keep2);
      }
    } else if (!refusal.empty() && fused_block_enabled() && cpu_kernels_available() && x.device().is_cpu() &&
               x.scalar_type() == torch::kFloat) {
      note_fused_fallback(refusal);
    }
  }
  if (post_norm) {  // timm's EvaBlockPostNorm: no LayerScale
    auto y =
        x + drop_path(norm1->forward(attn->forward(x, grid, mask, probs_out, rope)), drop_path_rate, is_training());
    return y + drop_path(norm2->forward(mlp->forward(y)), drop_path_rate, is_training());
  }
  auto a = attn->forward(norm1->forward(x), grid, mask, probs_out, rope);
  if (ls1) a = ls1->forward(a);
  if (gamma_1.defined()) a = gamma_1 * a;
  auto y = x + drop_path(a, drop_path_rate, is_training());
  auto m = mlp->forward(norm2->forward(y));
  if (ls2) m = ls2->forward(m);
  if (gamma_2.defined()) m = gamma_2 * m;
  return y + drop_path(m, drop_path_rate, is_training());
}

// ---- AttentionPool ----

AttentionPoolImpl::AttentionPoolImpl(const ModelConfig& config)
    : num_heads(config.pool_heads()),
      head_dim(config.embed_dim / config.pool_heads()),
      scale(1.0 / std::sqrt(static_cast<double>(config.embed_dim / config.pool_heads()))) {
  const int64_t dim = config.embed_dim;
  latent = register_parameter("latent", torch::zeros({1, 1, dim}));
  q = register_module("q", Linear(dim, dim));
  kv = register_module("kv", Linear(dim, 2 * dim));
  proj = register_module("proj", Linear(dim, dim));
  norm = register_module("norm", make_norm(config, dim));
  mlp = register_module("mlp", Mlp(dim, config.pool_hidden(), 0.0, config.act_layer));
}

torch::Tensor AttentionPoolImpl::forward(const torch::Tensor& x, torch::Tensor* probs_out) {
  const int64_t B = x.size(0), N = x.size(1), D = x.size(2);
  auto query = q->forward(latent.expand({B, -1, -1}).to(x.dtype()))
                   .reshape({B, 1, num_heads, head_dim})
                   .transpose(1, 2);  // (B, nh, 1, hd)
  auto keys_values = kv->forward(x).reshape({B, N, 2, num_heads, head_dim}).permute({2, 0, 3, 1, 4});
  auto keys = keys_values[0], values = keys_values[1];                            // (B, nh, Np, hd)
  auto probs = torch::matmul(query * scale, keys.transpose(-2, -1)).softmax(-1);  // (B, nh, 1, Np)
  if (probs_out != nullptr) *probs_out = probs;
  auto out = torch::matmul(probs, values).transpose(1, 2).reshape({B, 1, D});  // (B, 1, D), heads concatenated
  out = proj->forward(out);
  out = out + mlp->forward(norm->forward(out));
  return out.select(1, 0);  // (B, D): the one latent
}
}  // namespace vit
