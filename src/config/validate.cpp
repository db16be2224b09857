// The checks of a config's values after parsing (config/validate.h): each names its key through the field names.
#include "config/validate.h"

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include <nlohmann/json.hpp>

#include "util/text.h"

namespace vit {
namespace {

[[noreturn]] void fail(const std::string& source, const std::string& path, const std::string& what) {
  throw std::invalid_argument(printable(source + ": " + path + ": " + what));
}

void check(bool ok, const std::string& source, const std::string& path, const std::string& what) {
  if (!ok) fail(source, path, what);
}

std::string num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// "[low, high]", built by appending: GCC 12 in C++20 mode warns falsely (-Wstringop-overflow) on "[" + std::string&&.
template <typename Pair>
std::string interval(const Pair& range) {
  std::string text = "[";
  text += num(range[0]);
  text += ", ";
  text += num(range[1]);
  text += "]";
  return text;
}

void check_range(double v, double lo, double hi, bool hi_open, const std::string& source, const std::string& path) {
  const bool ok = v >= lo && (hi_open ? v < hi : v <= hi);
  check(ok, source, path, num(v) + " is out of range [" + num(lo) + ", " + num(hi) + (hi_open ? ")" : "]"));
}

}  // namespace

void validate(const ModelConfig& m, const std::string& source) {
  const std::string img_size = std::string("model.") + kImgSizeKey;
  auto in_range = [&](int64_t value, int64_t low, int64_t high, const std::string& key) {
    check(value >= low && value <= high, source, key,
          std::to_string(value) + " is out of range [" + std::to_string(low) + ", " + std::to_string(high) + "]");
  };
  const std::string size = size_text(m.img_h, m.img_w);
  check(m.img_h > 0 && m.img_w > 0 && m.img_h <= kMaxImageSide && m.img_w <= kMaxImageSide, source, img_size,
        size + " is out of range: each side in [1, " + std::to_string(kMaxImageSide) + "]");
  in_range(m.patch_size, 1, kMaxImageSide, VIT_MODEL_KEY(patch_size));
  check(m.img_h % m.patch_size == 0 && m.img_w % m.patch_size == 0, source, img_size,
        size + " is not divisible by patch_size " + std::to_string(m.patch_size));
  check(m.grid_h() * m.grid_w() <= kMaxPatches, source, img_size,
        size + " with patch_size " + std::to_string(m.patch_size) + " makes " + std::to_string(m.grid_h()) + "x" +
            std::to_string(m.grid_w()) + " patches, more than " + std::to_string(kMaxPatches));
  in_range(m.in_chans, 1, kMaxInChans, VIT_MODEL_KEY(in_chans));
  in_range(m.num_classes, 0, kMaxClasses, VIT_MODEL_KEY(num_classes));
  in_range(m.embed_dim, 1, kMaxEmbedDim, VIT_MODEL_KEY(embed_dim));
  in_range(m.depth, 1, kMaxDepth, VIT_MODEL_KEY(depth));
  in_range(m.num_heads, 1, m.embed_dim, VIT_MODEL_KEY(num_heads));
  check(m.embed_dim % m.num_heads == 0, source, VIT_MODEL_KEY(num_heads),
        std::to_string(m.num_heads) + " does not divide embed_dim " + std::to_string(m.embed_dim));
  check(m.mlp_ratio > 0 && m.mlp_ratio <= kMaxMlpRatio, source, VIT_MODEL_KEY(mlp_ratio),
        num(m.mlp_ratio) + " is out of range (0, " + num(kMaxMlpRatio) + "]");
  check(m.global_pool != GlobalPool::token || m.class_token, source, VIT_MODEL_KEY(global_pool),
        "\"token\" pooling needs class_token true (use \"avg\" or \"map\")");
  check(m.reg_tokens >= 0 && m.reg_tokens <= 256, source, VIT_MODEL_KEY(reg_tokens),
        std::to_string(m.reg_tokens) + " is out of range [0, 256]");
  const nlohmann::json fields = to_json(m);  // named: items() refers into it
  for (const auto& [field, value] : fields.items()) {  // every rate of the field list
    if (is_dropout_rate(field)) check_range(value.get<double>(), 0, 1, true, source, "model." + field);
  }
  check(m.layer_norm_eps > 0, source, VIT_MODEL_KEY(layer_norm_eps), num(m.layer_norm_eps) + " must be positive");
  check(!m.init_values || *m.init_values > 0, source, VIT_MODEL_KEY(init_values),
        num(m.init_values.value_or(0)) + " must be positive (or null for no LayerScale)");
  if (m.attn_pool_num_heads) {
    const int64_t heads = *m.attn_pool_num_heads;
    check(heads >= 1 && m.embed_dim % heads == 0, source, VIT_MODEL_KEY(attn_pool_num_heads),
          std::to_string(heads) + " does not divide embed_dim " + std::to_string(m.embed_dim));
  }
  if (m.attn_pool_mlp_ratio) {
    check(*m.attn_pool_mlp_ratio > 0 && *m.attn_pool_mlp_ratio <= kMaxMlpRatio, source,
          VIT_MODEL_KEY(attn_pool_mlp_ratio),
          num(*m.attn_pool_mlp_ratio) + " is out of range (0, " + num(kMaxMlpRatio) + "]");
  }
  // timm's Eva options: VisionTransformer has none of them.
  const ModelConfig plain;
  if (m.model_class == ModelClass::vision_transformer) {
    const std::vector<std::pair<std::string, bool>> eva_only = {
        {VIT_MODEL_KEY(use_abs_pos_emb), m.use_abs_pos_emb != plain.use_abs_pos_emb},
        {VIT_MODEL_KEY(use_rot_pos_emb), m.use_rot_pos_emb != plain.use_rot_pos_emb},
        {VIT_MODEL_KEY(qkv_fused), m.qkv_fused != plain.qkv_fused},
        {VIT_MODEL_KEY(swiglu_mlp), m.swiglu_mlp != plain.swiglu_mlp},
        {VIT_MODEL_KEY(attn_only_layer_scale), m.attn_only_layer_scale != plain.attn_only_layer_scale},
        {VIT_MODEL_KEY(use_post_norm), m.use_post_norm != plain.use_post_norm},
        {VIT_MODEL_KEY(num_kv_heads), !m.num_kv_heads.empty()},
        {VIT_MODEL_KEY(rope_shift_coords), m.rope_shift_coords.has_value()},
        {VIT_MODEL_KEY(rope_jitter_coords), m.rope_jitter_coords.has_value()},
        {VIT_MODEL_KEY(rope_rescale_coords), m.rope_rescale_coords.has_value()}};
    for (const auto& [key, set] : eva_only) {
      check(!set, source, key, "is an option of timm's Eva class: it needs model_class \"eva\"");
    }
  }
  check(m.model_class == ModelClass::vision_transformer || m.mlp_layer == plain.mlp_layer, source,
        VIT_MODEL_KEY(mlp_layer), "is an option of timm's VisionTransformer (Eva's MLP is chosen by swiglu_mlp)");
  if (m.mlp_layer == MlpLayer::swiglu_packed) {
    const auto rows = static_cast<int64_t>(static_cast<double>(m.embed_dim) * m.mlp_ratio);
    check(rows % 2 == 0, source, VIT_MODEL_KEY(mlp_layer),
          "swiglu_packed needs an even fc1 width (embed_dim * mlp_ratio = " + std::to_string(rows) + ")");
  }
  if (m.use_rot_pos_emb) {
    check(m.head_dim() % 4 == 0, source, VIT_MODEL_KEY(use_rot_pos_emb),
          "rotary embeddings need a head dim divisible by 4 (embed_dim / num_heads = " + std::to_string(m.head_dim()) +
              ")");
    check(m.rope_type != RopeType::mixed || !m.rope_rotate_half, source, VIT_MODEL_KEY(rope_rotate_half),
          "rope_type \"mixed\" rotates adjacent pairs (timm refuses rotate_half with it)");
    check(m.rope_temperature > 0, source, VIT_MODEL_KEY(rope_temperature),
          num(m.rope_temperature) + " must be positive");
  }
  // The relative bias and the rotary table are laid out over the whole grid, not over each image's kept tokens.
  check(m.patch_drop_rate == 0 || (!m.rel_pos_bias && !m.use_rot_pos_emb), source, VIT_MODEL_KEY(patch_drop_rate),
        "cannot leave out patch tokens with rel_pos_bias or rotary embeddings (their positions span the whole grid)");
  check((m.ref_feat_h == 0 && m.ref_feat_w == 0) ||
            (m.ref_feat_h > 0 && m.ref_feat_w > 0 && m.ref_feat_h <= kMaxImageSide && m.ref_feat_w <= kMaxImageSide),
        source, "model.ref_feat_shape", size_text(m.ref_feat_h, m.ref_feat_w) + " must be positive (or 0 for none)");
  // timm's _coord_aug_config: a shift in the grid's units (>= 0), jitter and rescale as factors (>= 1).
  for (const auto& [key, value, least] : {std::tuple{VIT_MODEL_KEY(rope_shift_coords), m.rope_shift_coords, 0.0},
                                          std::tuple{VIT_MODEL_KEY(rope_jitter_coords), m.rope_jitter_coords, 1.0},
                                          std::tuple{VIT_MODEL_KEY(rope_rescale_coords), m.rope_rescale_coords, 1.0}}) {
    check(!value || (std::isfinite(*value) && *value >= least), source, key,
          num(value.value_or(0)) + " must be finite and at least " + num(least) + " (or null for off)");
  }
  check(
      !m.use_post_norm || (!m.qk_norm && !m.attn_only_layer_scale && !m.init_values), source,
      VIT_MODEL_KEY(use_post_norm),
      "post-norm blocks have no qk_norm, LayerScale (init_values) or attn_only_layer_scale (timm's EvaBlockPostNorm)");
  if (!m.num_kv_heads.empty()) {
    const auto count = static_cast<int64_t>(m.num_kv_heads.size());
    check(count == 1 || count == m.depth, source, VIT_MODEL_KEY(num_kv_heads),
          std::to_string(count) + " values for depth " + std::to_string(m.depth) + " (one, or one per block)");
    bool grouped = false;
    for (const int64_t heads : m.num_kv_heads) {
      check(heads >= 1 && heads <= m.num_heads && m.num_heads % heads == 0, source, VIT_MODEL_KEY(num_kv_heads),
            std::to_string(heads) + " does not divide num_heads " + std::to_string(m.num_heads));
      grouped = grouped || heads != m.num_heads;
    }
    check(!grouped || (m.attn_type == AttnType::rope && !m.qkv_fused && !m.use_post_norm &&
                       !(m.use_rot_pos_emb && m.rope_type == RopeType::mixed)),
          source, VIT_MODEL_KEY(num_kv_heads),
          "grouped-query attention needs attn_type \"rope\" and qkv_fused false, without use_post_norm or rope_type "
          "\"mixed\" (timm's AttentionRope)");
  }
  check(m.swiglu_align_to >= 0 && m.swiglu_align_to <= 4096, source, VIT_MODEL_KEY(swiglu_align_to),
        std::to_string(m.swiglu_align_to) + " is out of range [0, 4096]");
}

void validate_preprocess(const Preprocess& p, const std::string& source, const std::string& section) {
  check(p.crop_pct > 0 && p.crop_pct <= 1, source, VIT_KEY(Preprocess, section, crop_pct),
        num(p.crop_pct) + " is out of range (0, 1]");
  check(p.mean.size() == p.std.size(), source, VIT_KEY(Preprocess, section, std),
        std::to_string(p.std.size()) + " values, but mean has " + std::to_string(p.mean.size()));
  for (double v : p.std) check(v > 0, source, VIT_KEY(Preprocess, section, std), num(v) + " must be positive");
}

void validate_augment(const AugmentConfig& a, const std::string& source) {
  check(a.scale[0] > 0 && a.scale[0] <= a.scale[1] && a.scale[1] <= 1, source, VIT_AUGMENT_KEY(scale),
        interval(a.scale) + " must satisfy 0 < low <= high <= 1");
  check(a.ratio[0] > 0 && a.ratio[0] <= a.ratio[1], source, VIT_AUGMENT_KEY(ratio),
        interval(a.ratio) + " must satisfy 0 < low <= high");
  check(a.pad_crop >= 0, source, VIT_AUGMENT_KEY(pad_crop), std::to_string(a.pad_crop) + " must be >= 0");
  check_range(a.hflip, 0, 1, false, source, VIT_AUGMENT_KEY(hflip));
  check(a.randaugment_ops >= 0, source, VIT_AUGMENT_KEY(randaugment_ops),
        std::to_string(a.randaugment_ops) + " must be >= 0");
  check_range(a.randaugment_magnitude, 0, 30, false, source, VIT_AUGMENT_KEY(randaugment_magnitude));
  check_range(a.random_erasing, 0, 1, false, source, VIT_AUGMENT_KEY(random_erasing));
  check(a.mixup_alpha >= 0, source, VIT_AUGMENT_KEY(mixup_alpha), num(a.mixup_alpha) + " must be >= 0");
  check(a.cutmix_alpha >= 0, source, VIT_AUGMENT_KEY(cutmix_alpha), num(a.cutmix_alpha) + " must be >= 0");
  check_range(a.mix_prob, 0, 1, false, source, VIT_AUGMENT_KEY(mix_prob));
  check_range(a.switch_prob, 0, 1, false, source, VIT_AUGMENT_KEY(switch_prob));
}

void validate_data(const DataConfig& d, const std::string& source) {
  validate_preprocess(d.preprocess, source, "data");
  validate_augment(d.augment, source);
  check_range(d.val_fraction, 0, 1, true, source, VIT_DATA_KEY(val_fraction));
  check(d.train_subset >= 0, source, VIT_DATA_KEY(train_subset), std::to_string(d.train_subset) + " must be >= 0");
  check(d.val_subset >= 0, source, VIT_DATA_KEY(val_subset), std::to_string(d.val_subset) + " must be >= 0");
  check(d.train_per_class >= 0, source, VIT_DATA_KEY(train_per_class),
        std::to_string(d.train_per_class) + " must be >= 0");
  for (size_t i = 0; i < d.classes.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      check(d.classes[i] != d.classes[j], source, VIT_DATA_KEY(classes), "\"" + d.classes[i] + "\" is listed twice");
    }
  }
  check(d.num_workers >= 0, source, VIT_DATA_KEY(num_workers), std::to_string(d.num_workers) + " must be >= 0");
  check(d.prefetch_batches >= 1, source, VIT_DATA_KEY(prefetch_batches),
        std::to_string(d.prefetch_batches) + " must be >= 1");
  check(d.shuffle_buffer >= 0, source, VIT_DATA_KEY(shuffle_buffer),
        std::to_string(d.shuffle_buffer) + " must be >= 0");
  check(!d.label_field.empty(), source, VIT_DATA_KEY(label_field), "must not be empty");
}

void validate_train(const TrainConfig& t, const std::string& source) {
  auto positive = [&](int64_t v, const std::string& key) {
    check(v >= 1, source, key, std::to_string(v) + " must be at least 1");
  };
  auto non_negative = [&](int64_t v, const std::string& key) {
    check(v >= 0, source, key, std::to_string(v) + " must be >= 0");
  };
  positive(t.epochs, VIT_TRAIN_KEY(epochs));
  positive(t.batch_size, VIT_TRAIN_KEY(batch_size));
  positive(t.accum_steps, VIT_TRAIN_KEY(accum_steps));
  positive(t.log_interval, VIT_TRAIN_KEY(log_interval));
  positive(t.eval_interval, VIT_TRAIN_KEY(eval_interval));
  non_negative(t.warmup_steps, VIT_TRAIN_KEY(warmup_steps));
  non_negative(t.threads, VIT_TRAIN_KEY(threads));
  non_negative(t.checkpoint_interval, VIT_TRAIN_KEY(checkpoint_interval));
  non_negative(t.max_steps, VIT_TRAIN_KEY(max_steps));
  check(t.lr > 0, source, VIT_TRAIN_KEY(lr), num(t.lr) + " must be positive");
  check(t.min_lr >= 0 && t.min_lr <= t.lr, source, VIT_TRAIN_KEY(min_lr), num(t.min_lr) + " must be in [0, lr]");
  check(t.warmup_lr >= 0, source, VIT_TRAIN_KEY(warmup_lr), num(t.warmup_lr) + " must be >= 0");
  check(t.warmup_epochs >= 0, source, VIT_TRAIN_KEY(warmup_epochs), num(t.warmup_epochs) + " must be >= 0");
  check(t.weight_decay >= 0, source, VIT_TRAIN_KEY(weight_decay), num(t.weight_decay) + " must be >= 0");
  check_range(t.beta1, 0, 1, true, source, VIT_TRAIN_KEY(beta1));
  check_range(t.beta2, 0, 1, true, source, VIT_TRAIN_KEY(beta2));
  check(t.eps > 0, source, VIT_TRAIN_KEY(eps), num(t.eps) + " must be positive");
  check(t.clip_grad >= 0, source, VIT_TRAIN_KEY(clip_grad), num(t.clip_grad) + " must be >= 0 (0 = off)");
  check_range(t.label_smoothing, 0, 1, true, source, VIT_TRAIN_KEY(label_smoothing));
  check_range(t.ema_decay, 0, 1, true, source, VIT_TRAIN_KEY(ema_decay));
  check(t.final_weights != Weights::ema || t.ema_decay > 0, source, VIT_TRAIN_KEY(final_weights),
        "\"ema\" needs " + VIT_TRAIN_KEY(ema_decay) + " > 0");
  check(t.layer_decay > 0 && t.layer_decay <= 1, source, VIT_TRAIN_KEY(layer_decay),
        num(t.layer_decay) + " is out of range (0, 1]");
  for (const auto& prefix : t.freeze) {
    check(!prefix.empty(), source, VIT_TRAIN_KEY(freeze), "\"\" is not a parameter prefix");
  }
  check(t.device == "auto" || t.device == "cpu" || t.device.rfind("cuda", 0) == 0, source, VIT_TRAIN_KEY(device),
        "\"" + t.device + "\" is not one of: auto, cpu, cuda, cuda:N");
  check(t.target_top1 >= 0 && t.target_top1 <= 100, source, VIT_TRAIN_KEY(target_top1),
        num(t.target_top1) + " is out of range [0, 100] (0 = no target)");
  check(t.dist_timeout_s > 0, source, VIT_TRAIN_KEY(dist_timeout_s), num(t.dist_timeout_s) + " must be positive");
}

void validate_channels(const Config& config, const std::string& source) {
  const auto channels = static_cast<size_t>(config.model.in_chans);
  const auto& p = config.data.preprocess;
  check(p.mean.size() == 1 || p.mean.size() == channels, source, VIT_PREPROCESS_KEY(mean),
        std::to_string(p.mean.size()) + " values for a model with in_chans " + std::to_string(channels));
}

}  // namespace vit
