// The Vision Transformer: embedding, blocks, pooling and head (model/vit.h); its modules are in model/layers.cpp.
#include "model/vit.h"

#include <torch/version.h>

#include <set>
#include <sstream>
#include <stdexcept>

#include "model/autocast.h"
#include "util/text.h"

namespace vit {
namespace F = torch::nn::functional;

namespace {

// timm's trunc_normal_(std=0.02) truncates at absolute +-2, which a 0.02 normal never reaches in practice.
void trunc_normal_(torch::Tensor& t, double std) {
  torch::NoGradGuard no_grad;
  t.normal_(0.0, std).clamp_(-2.0, 2.0);
}

}  // namespace

// ---- VisionTransformer ----

VisionTransformerImpl::VisionTransformerImpl(const ModelConfig& config, Init init) : config_(config) {
  validate(config, "model");
  const int64_t dim = config.embed_dim;
  const int64_t patches = config.grid_h() * config.grid_w();
  patch_embed = register_module("patch_embed", PatchEmbed(config));
  if (config.class_token) cls_token = register_parameter("cls_token", torch::zeros({1, 1, dim}));
  if (config.reg_tokens > 0) reg_token = register_parameter("reg_token", torch::zeros({1, config.reg_tokens, dim}));
  if (config.use_abs_pos_emb) {
    pos_embed = register_parameter("pos_embed", torch::zeros({1, patches + config.pos_embed_prefix(), dim}));
  }
  if (config.use_rot_pos_emb) rope = register_module("rope", RotaryEmbedding(config));
  auto ln = [&] { return make_norm(config, dim); };
  if (config.pre_norm) norm_pre = register_module("norm_pre", ln());
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.depth; ++i) {
    // Stochastic depth grows linearly over the blocks, as timm.
    const double rate = config.depth > 1 ? config.drop_path_rate * static_cast<double>(i) / (config.depth - 1) : 0.0;
    blocks->push_back(Block(config, rate, i));
  }
  if (config.final_norm && !config.use_fc_norm()) norm = register_module("norm", ln());
  if (config.global_pool == GlobalPool::map) attn_pool = register_module("attn_pool", AttentionPool(config));
  if (config.final_norm && config.use_fc_norm()) fc_norm = register_module("fc_norm", ln());
  if (config.num_classes > 0) head = register_module("head", Linear(dim, config.num_classes));
  if (init == Init::random) reset_parameters();
}

torch::Device VisionTransformerImpl::device() const { return patch_embed->proj->weight.device(); }

void VisionTransformerImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  const bool eva = config_.model_class == ModelClass::eva;
  if (pos_embed.defined()) trunc_normal_(pos_embed, 0.02);
  if (cls_token.defined()) eva ? trunc_normal_(cls_token, 0.02) : void(cls_token.normal_(0.0, 1e-6));
  if (reg_token.defined()) eva ? trunc_normal_(reg_token, 0.02) : void(reg_token.normal_(0.0, 1e-6));
  if (attn_pool) {
    // timm's trunc_normal_tf_(std = D^-0.5): truncated at two standard deviations.
    const double std = 1.0 / std::sqrt(static_cast<double>(config_.embed_dim));
    attn_pool->latent.normal_(0.0, std).clamp_(-2.0 * std, 2.0 * std);
  }
  // Patch embedding keeps PyTorch's default Conv2d init, as timm's default ("") scheme does.
  patch_embed->proj->reset_parameters();
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* dense = module->as<Linear>()) {
      trunc_normal_(dense->weight, 0.02);
      if (dense->bias.defined()) dense->bias.zero_();
    } else if (auto* layer_norm = module->as<Norm>()) {
      layer_norm->weight.fill_(1.0);
      if (layer_norm->bias.defined()) layer_norm->bias.zero_();
    } else if (auto* attention = module->as<Attention>()) {
      if (attention->relative_position_bias_table.defined()) attention->relative_position_bias_table.zero_();
      if (attention->q_bias.defined()) attention->q_bias.zero_(), attention->v_bias.zero_();
    } else if (auto* scale = module->as<LayerScale>()) {
      scale->gamma.fill_(*config_.init_values);
    }
  }
  if (!eva) return;
  // timm's Eva: LayerScale at init_values, the residual branches' output projections divided by sqrt(2 (layer + 1))
  // (fix_init_weight), the head scaled by head_init_scale 0.001, rope.freqs as init_random_2d_freqs.
  for (size_t i = 0; i < blocks->size(); ++i) {
    auto block = blocks[i]->as<Block>();
    if (block->gamma_1.defined()) block->gamma_1.fill_(*config_.init_values);
    if (block->gamma_2.defined()) block->gamma_2.fill_(*config_.init_values);
    const double scale = std::sqrt(2.0 * static_cast<double>(i + 1));
    block->attn->proj->weight.div_(scale);
    block->mlp->fc2->weight.div_(scale);
  }
  if (head) head->weight.mul_(0.001), head->bias.mul_(0.001);
  if (rope) rope->reset_parameters();
}

torch::Tensor resample_pos_embed(const torch::Tensor& pos_embed, int64_t old_h, int64_t old_w, int64_t new_h,
                                 int64_t new_w, int64_t num_prefix_tokens) {
  TORCH_CHECK(pos_embed.dim() == 3 && pos_embed.size(1) == num_prefix_tokens + old_h * old_w,
              "pos_embed ", pos_embed.sizes(), " does not hold ", num_prefix_tokens, " prefix tokens and a ", old_h,
              "x", old_w, " grid");
  if (old_h == new_h && old_w == new_w) return pos_embed;
  const int64_t dim = pos_embed.size(2);
  auto prefix = pos_embed.narrow(1, 0, num_prefix_tokens);  // (1, prefix, D)
  auto grid = pos_embed.narrow(1, num_prefix_tokens, old_h * old_w)
                  .reshape({1, old_h, old_w, dim})
                  .permute({0, 3, 1, 2})
                  .to(torch::kFloat32);  // (1, D, gh0, gw0)
  auto options = F::InterpolateFuncOptions()
                     .size(std::vector<int64_t>{new_h, new_w})
                     .mode(torch::kBicubic)
                     .align_corners(false)
                     .antialias(true);  // timm's default, also when enlarging (another kernel than plain bicubic)
  auto resized = F::interpolate(grid, options)
                     .permute({0, 2, 3, 1})
                     .reshape({1, new_h * new_w, dim})
                     .to(pos_embed.dtype());  // (1, gh*gw, D)
  return torch::cat({prefix, resized}, 1);
}

torch::Tensor drop_patches(const torch::Tensor& tokens, int64_t keep, int64_t prefix) {
  const int64_t B = tokens.size(0), patches = tokens.size(1) - prefix;
  const auto order =  // (B, patches): timm's draw, one random order per image
      torch::argsort(torch::randn({B, patches}, tokens.options().dtype(torch::kFloat)), /*dim=*/int64_t{-1});
  const auto index = order.narrow(1, 0, keep).unsqueeze(-1).expand({-1, -1, tokens.size(2)});  // (B, keep, D)
  auto kept = tokens.narrow(1, prefix, patches).gather(1, index);                              // (B, keep, D)
  return prefix > 0 ? torch::cat(std::vector<torch::Tensor>{tokens.narrow(1, 0, prefix), kept}, 1) : kept;
}

torch::Tensor VisionTransformerImpl::pos_embed_for(int64_t grid_h, int64_t grid_w) {
  if (!pos_embed.defined()) return {};
  return resample_pos_embed(pos_embed, config_.grid_h(), config_.grid_w(), grid_h, grid_w, config_.pos_embed_prefix());
}

torch::Tensor VisionTransformerImpl::forward_features(const torch::Tensor& x, const torch::Tensor& mask,
                                                      Capture* capture) {
  const int64_t P = config_.patch_size;
  if (x.dim() != 4 || x.size(1) != config_.in_chans) {
    std::ostringstream message;
    message << "cannot forward input of shape " << x.sizes() << ": model expects (B, " << config_.in_chans
            << ", H, W)";
    throw std::invalid_argument(message.str());
  }
  const int64_t H = x.size(2), W = x.size(3);
  if (H % P != 0 || W % P != 0 || H == 0 || W == 0) {
    throw std::invalid_argument("cannot forward " + size_text(H, W) + ": not divisible by patch " +
                                std::to_string(P) + " (model trained at " + size_text(config_.img_h, config_.img_w) +
                                ")");
  }
  const std::array<int64_t, 2> grid{H / P, W / P};
  std::optional<AutocastScope> autocast;  // --precision fp16 / bf16 on CUDA
  if (cuda_autocast(x)) autocast.emplace(true, precision_ == Precision::fp16 ? torch::kHalf : torch::kBFloat16);
  auto tokens = patch_embed->forward(x);  // (B, gh*gw, D)
  const int64_t B = tokens.size(0);
  std::vector<torch::Tensor> parts;  // prefix tokens, then the patches
  if (cls_token.defined()) parts.push_back(cls_token.expand({B, -1, -1}).to(tokens.dtype()));
  if (reg_token.defined()) parts.push_back(reg_token.expand({B, -1, -1}).to(tokens.dtype()));
  auto pos = pos_embed_for(grid[0], grid[1]);
  if (pos.defined()) pos = pos.to(tokens.dtype());
  if (pos.defined() && config_.no_embed_class) tokens = tokens + pos;  // the patches only, before the prefix (DeiT-3)
  if (!parts.empty()) {
    parts.push_back(tokens);
    tokens = torch::cat(parts, 1);
  }
  if (pos.defined() && !config_.no_embed_class) tokens = tokens + pos;  // (B, N, D)
  // The rotary table for this grid (one per block and head with rope_type mixed): Eva's rope.get_embed(shape).
  const torch::Tensor rotary = rope ? rope->embed(grid).to(tokens.device()) : torch::Tensor();
  auto rope_of = [&](int64_t block) {
    return rotary.defined() && config_.rope_type == RopeType::mixed ? rotary[block] : rotary;
  };
  if (config_.pos_drop_rate > 0.0 && is_training()) tokens = torch::dropout(tokens, config_.pos_drop_rate, true);
  if (config_.patch_drop_rate > 0.0 && is_training()) {
    if (mask.defined())
      throw std::invalid_argument("an attention mask needs every token: patch_drop_rate leaves some out");
    const int64_t prefix = config_.num_prefix_tokens();
    tokens = drop_patches(tokens, config_.patches_kept_in_training(tokens.size(1) - prefix), prefix);
  }
  if (norm_pre) tokens = norm_pre->forward(tokens);
  if (capture != nullptr) capture->embed = tokens;

  const bool want_probs = capture != nullptr && capture->attention;
  if (chunked_inference(tokens) && capture == nullptr && !mask.defined() && tokens.size(0) > 1) {
    // CPU inference runs all blocks on a few images at a time, so the widest intermediate (the MLP's hidden
    // activations) stays under ~8 MiB: it then stays in cache between the products that write and read it, and comes
    // back from the heap instead of fresh pages for every product (glibc maps anything over 32 MiB anew each time).
    // int8 ViT-B/16 at batch 32 went from 17 to 34 img/s; fp32 ViT-Ti/16 at batch 32 from 69.5 to 74.5 img/s (medians
    // of 3, 2 threads). In float32 a chunk keeps at least 2 x embed_dim rows, so that each block's weights are read
    // for enough rows: ViT-B/16 in 3-image chunks lost 3%, in 8-image ones it runs as unchunked; ViT-S/16 as before.
    const int64_t N = tokens.size(1);
    const int64_t hidden = config_.mlp_hidden() * (config_.gated_mlp() ? 2 : 1);
    int64_t per_chunk = std::max<int64_t>(1, (int64_t{8} << 20) / (N * hidden * 4));
    if (precision_ == Precision::fp32) per_chunk = std::max(per_chunk, (2 * config_.embed_dim + N - 1) / N);
    std::vector<torch::Tensor> chunks;
    for (auto chunk : tokens.split(per_chunk)) {
      for (size_t b = 0; b < blocks->size(); ++b) {
        chunk = blocks[b]->as<Block>()->forward(chunk, grid, mask, nullptr, rope_of(static_cast<int64_t>(b)));
      }
      chunks.push_back(chunk);
    }
    tokens = chunks.size() == 1 ? chunks[0] : torch::cat(chunks);
    if (norm) tokens = norm->forward(tokens);
    return tokens;
  }
  for (size_t b = 0; b < blocks->size(); ++b) {
    torch::Tensor probs;
    tokens = blocks[b]->as<Block>()->forward(tokens, grid, mask, want_probs ? &probs : nullptr,
                                             rope_of(static_cast<int64_t>(b)));
    if (want_probs) capture->attention_probs.push_back(probs);
    if (capture != nullptr && capture->block_outputs) capture->outputs.push_back(tokens);
  }
  if (norm) tokens = norm->forward(tokens);
  return autocast ? tokens.to(torch::kFloat) : tokens;  // (B, N, D)
}

torch::Tensor VisionTransformerImpl::forward_head(const torch::Tensor& tokens, bool pre_logits, Capture* capture) {
  const int64_t prefix = num_prefix_tokens();
  std::optional<AutocastScope> autocast;
  if (cuda_autocast(tokens)) autocast.emplace(true, precision_ == Precision::fp16 ? torch::kHalf : torch::kBFloat16);
  torch::Tensor pooled;  // (B, D)
  if (attn_pool) {
    const bool want_probs = capture != nullptr && capture->attention;
    const int64_t skip = config_.pool_includes_prefix() ? 0 : prefix;
    pooled = attn_pool->forward(tokens.narrow(1, skip, tokens.size(1) - skip),
                                want_probs ? &capture->pool_attention : nullptr);
  } else if (config_.global_pool == GlobalPool::avg) {
    // Without prefix tokens no narrow: its backward would fill a zero gradient and copy into it (0.3 ms a step).
    pooled = (prefix > 0 ? tokens.narrow(1, prefix, tokens.size(1) - prefix) : tokens).mean(1);
  } else {
    pooled = tokens.select(1, 0);
  }
  if (fc_norm) pooled = fc_norm->forward(pooled);
  if (config_.drop_rate > 0.0 && is_training()) pooled = torch::dropout(pooled, config_.drop_rate, true);
  if (pre_logits || !head) return autocast ? pooled.to(torch::kFloat) : pooled;
  auto logits = head->forward(pooled);  // (B, K)
  return autocast ? logits.to(torch::kFloat) : logits;
}

bool VisionTransformerImpl::chunked_inference(const torch::Tensor& x) const {
  return x.device().is_cpu() && !torch::GradMode::is_enabled();
}

bool VisionTransformerImpl::cuda_autocast(const torch::Tensor& x) const {
  return (precision_ == Precision::fp16 || precision_ == Precision::bf16) && x.is_cuda();
}

void VisionTransformerImpl::set_precision(Precision precision) {
  const auto device = this->device().type();
  const auto refusal = precision_refusal(precision, device);
  if (!refusal.empty()) throw std::invalid_argument(refusal);
  // Packed layers are made from the weights as they are now; fp32 and CUDA keep none.
  const bool pack = precision != Precision::fp32 && device == torch::kCPU;
  torch::NoGradGuard no_grad;
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* dense = module->as<Linear>()) {
      dense->packed = pack ? std::make_shared<PackedLinear>(dense->weight, dense->bias, precision) : nullptr;
    }
  }
  const auto& conv = patch_embed->proj;
  patch_embed->packed =
      pack ? std::make_shared<PackedLinear>(conv->weight.reshape({conv->weight.size(0), -1}), conv->bias, precision)
           : nullptr;
  precision_ = precision;
}

std::vector<std::string> VisionTransformerImpl::quantized_weight_names() {
  std::vector<std::string> names{"patch_embed.proj.weight"};
  for (const auto& item : named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    if (item.value()->as<Linear>() != nullptr) names.push_back(item.key() + ".weight");
  }
  return names;
}

int64_t VisionTransformerImpl::weight_bytes() {
  std::set<const void*> packed_tensors;  // the float32 weights a packed layer replaces
  int64_t bytes = 0;
  auto count_packed = [&](const std::shared_ptr<PackedLinear>& packed, std::initializer_list<torch::Tensor> replaced) {
    if (!packed) return;
    bytes += packed->weight_bytes();
    for (const auto& t : replaced) {
      if (t.defined()) packed_tensors.insert(t.unsafeGetTensorImpl());
    }
  };
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* dense = module->as<Linear>()) count_packed(dense->packed, {dense->weight, dense->bias});
  }
  count_packed(patch_embed->packed, {patch_embed->proj->weight, patch_embed->proj->bias});
  for (const auto& p : parameters()) {
    if (packed_tensors.count(p.unsafeGetTensorImpl()) == 0) bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
  return bytes;
}

torch::Tensor VisionTransformerImpl::forward(const torch::Tensor& x) { return forward_head(forward_features(x)); }

void VisionTransformerImpl::set_head_mask(int64_t layer, const std::vector<int64_t>& heads) {
  if (layer < 0 || layer >= config_.depth) {
    throw std::invalid_argument("head mask: layer " + std::to_string(layer) + " out of range [0, " +
                                std::to_string(config_.depth) + ")");
  }
  auto attention = blocks[layer]->as<Block>()->attn;
  if (heads.empty()) {
    attention->head_mask = torch::Tensor();
    return;
  }
  auto mask = attention->head_mask.defined() ? attention->head_mask : torch::ones({config_.num_heads});
  for (int64_t h : heads) {
    if (h < 0 || h >= config_.num_heads) {
      throw std::invalid_argument("head mask: head " + std::to_string(h) + " out of range [0, " +
                                  std::to_string(config_.num_heads) + ") in layer " + std::to_string(layer));
    }
    mask[h] = 0.0;
  }
  attention->head_mask = mask.to(device());
}

void VisionTransformerImpl::set_attention_kernel(AttentionKernel kernel) {
  for (const auto& module : *blocks) module->as<Block>()->attn->kernel = kernel;
}

void VisionTransformerImpl::set_fused_blocks(bool on) {
  for (const auto& module : *blocks) module->as<Block>()->fused = on;
}

void VisionTransformerImpl::set_bf16_products(bool on) {
  for (const auto& module : *blocks) module->as<Block>()->bf16_products = on;
}

torch::Tensor eval_logits(VisionTransformer& net, const torch::Tensor& images, bool hflip) {
  auto logits = net->forward(images);
  if (!hflip) return logits;
  return logits.add_(net->forward(images.flip({-1}))).mul_(0.5);
}

int64_t count_parameters(const torch::nn::Module& module) {
  int64_t total = 0;
  for (const auto& p : module.parameters()) total += p.numel();
  return total;
}

}  // namespace vit
