// timm snapshot folders (save_for_hf / push_to_hub): config.json's architecture, model_args, pretrained_cfg and
// label_names to our config and back, and the timm architecture name for a model.
#include <cmath>
#include <set>
#include <stdexcept>

#include "config/timm_architectures.h"
#include "io/snapshot_json.h"

namespace vit {
namespace snapshot_detail {
namespace {

// timm's model_args spell the model fields as we do (the field list's names are timm's VisionTransformer
// arguments), except these: fields timm's VisionTransformer has no argument for (the relative position bias is
// BEiT's), the norms and the MLP's form, which come with the architecture name (its norm_layer carries the epsilon,
// and mlp_layer is a class, not a name model_args can hold), and the training-time rates, which vit does not write
// (model_config.h's is_dropout_rate).
bool timm_lacks(const std::string& field) {
  static const std::set<std::string> fields = {"preset",     "layer_norm_eps",   "rel_pos_bias", "model_class",
                                               "norm_layer", "embed_norm_layer", "mlp_layer"};
  return fields.count(field) > 0;
}

// The fields only timm's Eva class has an argument for.
bool eva_only(const std::string& field) {
  // clang-format off
  static const std::set<std::string> fields = {
      "attn_only_layer_scale", "attn_pool_mlp_ratio", "attn_pool_num_heads", "attn_type",          "qkv_fused",
      "ref_feat_shape",        "rope_type",           "rope_temperature",    "rope_grid_offset",   "rope_grid_indexing",
      "rope_rotate_half",      "swiglu_align_to",     "swiglu_mlp",          "use_abs_pos_emb",    "use_rot_pos_emb",
      "use_post_norm",         "rope_shift_coords",   "rope_jitter_coords",  "rope_rescale_coords", "num_kv_heads"};
  // clang-format on
  return fields.count(field) > 0;
}

// A field's key in the model_args of m's timm class ("" where that class has no argument for it). Eva spells two
// fields otherwise, and places the final norm by use_fc_norm and use_post_transformer_norm (read and written apart).
std::string timm_key(const ModelConfig& m, const std::string& field) {
  if (timm_lacks(field)) return "";
  if (m.model_class == ModelClass::vision_transformer) {
    if (field == "scale_attn_inner") return "scale_attn_norm";
    if (field == "scale_mlp") return "scale_mlp_norm";
    return eva_only(field) ? "" : field;
  }
  if (field == "reg_tokens") return "num_reg_tokens";
  if (field == "pre_norm") return "use_pre_transformer_norm";
  if (field == "act_layer" || field == "final_norm" || field == "fc_norm" || field == "proj_bias") return "";
  return field;
}

// Eva's final norm: use_fc_norm (null: exactly with avg pooling) and use_post_transformer_norm (null: without fc_norm)
// as vit's final_norm and fc_norm. An architecture that turns both off (PE spatial) keeps them off unless model_args
// say otherwise.
void apply_eva_norms(const json& args, ModelConfig& m, const std::string& file) {
  auto flag = [&](const char* key) -> std::optional<bool> {
    const json& value = args.value(key, json());
    if (value.is_null()) return std::nullopt;
    if (!value.is_boolean()) {
      fail(file, std::string("model_args.") + key + ": " + show(value) + " is not true, false or null");
    }
    return value.get<bool>();
  };
  const auto fc_arg = flag("use_fc_norm"), post_arg = flag("use_post_transformer_norm");
  if (!fc_arg && !post_arg) return;
  const bool fc = fc_arg ? *fc_arg : m.final_norm && m.use_fc_norm();
  const bool post = post_arg ? *post_arg : (m.final_norm || fc_arg) && !fc;
  if (fc && post) {
    fail(file, "model_args: use_fc_norm and use_post_transformer_norm both true (vit has one final norm)");
  }
  m.final_norm = fc || post;
  m.fc_norm = m.final_norm ? std::optional<bool>(fc) : std::nullopt;
}

// model_args over the model the architecture name gave: every field through the config's readers, then timm's
// options we lack, each accepted only at the value that means "off".
void apply_timm_model_args(const json& args, ModelConfig& m, const std::string& file) {
  if (!args.is_object()) fail(file, "model_args: " + show(args) + " is not an object");
  json fields = args;
  // timm takes patch_size as a number or a pair; vit's patches are square.
  const json& patch = args.value("patch_size", json());
  if (patch.is_array() && patch.size() == 2 && patch[0] == patch[1]) fields["patch_size"] = patch[0];
  const ModelConfig as_named = m;  // the architecture name chose the class
  auto timm_name = [&](const std::string& field) { return timm_key(as_named, field); };
  const std::vector<std::string> others = read_fields(fields, "model_args", file, timm_name, m);
  const bool eva = m.model_class == ModelClass::eva;
  if (eva) apply_eva_norms(args, m, file);
  // Options of timm's VisionTransformer that change the architecture, each accepted only at its plain-ViT value.
  // clang-format off
  const std::map<std::string, json> plain = {
      {"dynamic_img_pad", false},  {"embed_layer", "PatchEmbed"}, {"block_fn", "Block"},
      {"patch_bias", true},        {"ignore_head", false},        {"attn_layer", "attn"},
      {"pool_include_prefix", false}, {"pos_embed", "learn"},
      // Eva's MRoPE.
      {"rope_mrope_section", nullptr},
  };
  // clang-format on

  // Options that do not change the weights or the inference result. dynamic_img_size: vit runs every size divisible
  // by the patch, resampling the position embedding as timm's dynamic_img_size does.
  const std::set<std::string> harmless = {"weight_init", "fix_init", "pretrained_cfg_overlay", "dynamic_img_size",
                                          "head_init_scale"};
  // The forms the architecture name gave (timm_lacks), which model_args may repeat but not change.
  const std::map<std::string, json> named = {
      {"norm_layer", name_of(m.norm_layer)},
      {"embed_norm_layer", m.embed_norm_layer ? json(name_of(*m.embed_norm_layer)) : json(nullptr)},
      {"mlp_layer", m.mlp_layer == MlpLayer::mlp      ? "Mlp"
                    : m.mlp_layer == MlpLayer::swiglu ? "SwiGLU"
                                                      : "SwiGLUPacked"}};
  for (const auto& key : others) {
    if (eva && (key == "use_fc_norm" || key == "use_post_transformer_norm")) continue;  // apply_eva_norms
    const json& value = args[key];
    const std::string where = "model_args." + key;
    if (auto it = named.find(key); it != named.end()) {
      if (!value.is_null() && value != it->second) {
        fail(file, where + " = " + show(value) + " differs from the architecture's " + show(it->second) +
                       " (vit takes the norms and the MLP's form from the architecture name)");
      }
    } else if (auto it = plain.find(key); it != plain.end()) {
      if (!value.is_null() && value != it->second) {
        fail(file, where + " = " + show(value) + " is not supported (vit builds only " + key + " = " +
                       show(it->second) + ")");
      }
    } else if (!harmless.count(key)) {
      fail(file, where + " = " + show(value) + " is not an option vit knows");
    }
  }
  // fc_norm stays null (timm's rule) where it says what the rule says: a model round-trips through timm unchanged.
  if (m.fc_norm && *m.fc_norm == (m.global_pool == GlobalPool::avg)) m.fc_norm.reset();
}

// What an architecture name of the wider timm ViT family needs that we lack, for the refusal.
std::string family_needs(const std::string& arch) {
  auto has = [&](const char* part) { return arch.find(part) != std::string::npos; };
  if (has("distilled")) return "DeiT's distillation token (dist_token)";
  if (has("_xp_") || has("18x2") || has("rpn") || has("pwee")) return "parallel or residual-post-norm blocks";
  if (has("dwee") || has("dlittle")) return "differential attention";
  if (has("so400m_patch14") && has("_384")) return "an input size that is not a whole number of patches (384 / 14)";
  if (has("beit")) return "relative position embeddings (timm's BEiT class)";
  return "";
}

// The crop_pct to write for timm, which computes floor(size / crop_pct) without our slack (eval_scale): one read from
// a Hugging Face processor as size / resized can land just under `resized` there (48 / (48 / 54) in some sizes), so
// such a crop_pct is written as size / (resized + 0.5), which gives `resized` back either way.
double timm_crop_pct(const Preprocess& p, const ModelConfig& m) {
  const int64_t resized = eval_scale(m.img_h, p.crop_pct);
  if (std::floor(static_cast<double>(m.img_h) / p.crop_pct) == static_cast<double>(resized)) return p.crop_pct;
  return static_cast<double>(m.img_h) / (static_cast<double>(resized) + 0.5);
}

}  // namespace

void read_timm(const json& config, Snapshot& s) {
  const std::string file = s.dir + "/config.json";
  const std::string full = get_or<std::string>(config, "architecture", "", file);
  if (full.empty()) fail(file, "no \"architecture\"");
  const std::string arch = full.substr(0, full.find('.'));  // a pretrained tag (".augreg_in21k") changes no size
  try {
    s.model = model_preset(arch);
  } catch (const std::invalid_argument&) {
    const std::string needs = family_needs(arch);
    fail(file, "architecture \"" + full + "\" is not supported" + (needs.empty() ? "" : ": it needs " + needs) +
                   " (`vit info --presets` lists the timm architectures vit builds)");
  }
  s.model.preset = "";
  s.model.num_classes = get_or<int64_t>(config, "num_classes", 1000, file);
  if (config.contains("global_pool")) apply_timm_model_args(json{{"global_pool", config["global_pool"]}}, s.model, file);
  if (config.contains("model_args")) apply_timm_model_args(config["model_args"], s.model, file);
  s.model.num_classes = get_or<int64_t>(config, "num_classes", s.model.num_classes, file);
  const json tag = config.contains("pretrained_cfg") ? config["pretrained_cfg"].value("tag", json()) : json();
  s.sources.emplace_back("model", "config.json: timm architecture " + full +
                                      (tag.is_string() ? " (pretrained tag " + tag.get<std::string>() + ")" : "") +
                                      (config.contains("model_args") ? " with its model_args" : ""));

  // timm's ViT defaults (vision_transformer._cfg) unless pretrained_cfg says otherwise.
  Preprocess p;
  p.crop_pct = 0.9;
  p.interpolation = Interpolation::bicubic;
  p.crop_mode = CropMode::center;
  const json cfg = config.value("pretrained_cfg", json::object());
  const std::string where = "pretrained_cfg.";
  if (cfg.contains("mean")) p.mean = numbers(cfg["mean"], file, where + "mean");
  if (cfg.contains("std")) p.std = numbers(cfg["std"], file, where + "std");
  if (cfg.contains("interpolation")) p.interpolation = interpolation_from(cfg["interpolation"], file, where + "interpolation");
  if (cfg.contains("crop_pct") && !cfg["crop_pct"].is_null()) p.crop_pct = numbers(cfg["crop_pct"], file, where + "crop_pct")[0];
  if (cfg.contains("crop_mode") && !cfg["crop_mode"].is_null()) {
    const auto mode = get_or<std::string>(cfg, "crop_mode", "center", file);
    auto parsed = enum_from_name<CropMode>(mode);
    if (!parsed) fail(file, where + "crop_mode: \"" + mode + "\" is not supported (vit crops with center or squash)");
    p.crop_mode = *parsed;
  }
  if (cfg.contains("input_size") && !cfg["input_size"].is_null()) {
    const auto size = numbers(cfg["input_size"], file, where + "input_size");
    if (size.size() != 3) fail(file, where + "input_size: " + show(cfg["input_size"]) + " is not [C, H, W]");
    if (size[0] != s.model.in_chans || size[1] != s.model.img_h || size[2] != s.model.img_w) {
      fail(file, where + "input_size " + show(cfg["input_size"]) + " differs from the model's [" +
                     std::to_string(s.model.in_chans) + ", " + std::to_string(s.model.img_h) + ", " +
                     std::to_string(s.model.img_w) + "]");
    }
  }
  s.preprocess = p;
  s.sources.emplace_back("preprocess", cfg.empty() ? "timm's ViT defaults (config.json has no pretrained_cfg)"
                                                   : "config.json: pretrained_cfg");
  // A list, or {index: name} where ids have gaps (those classes stay numbered).
  const json labels = config.value("label_names", cfg.value("label_names", json()));
  auto label = [](const json& l) { return l.is_string() ? l.get<std::string>() : l.dump(); };
  if (labels.is_array()) {
    for (const auto& l : labels) s.class_names.push_back(label(l));
  } else if (labels.is_object()) {
    s.class_names = numbered_classes(s.model.num_classes);
    for (const auto& [key, value] : labels.items()) {
      const auto index = class_index(key, s.model.num_classes);
      if (index < 0) fail(file, "label_names: key \"" + key + "\" is not a class index");
      s.class_names[index] = label(value);
    }
  }
  if (!s.class_names.empty()) s.sources.emplace_back("class_names", "config.json: label_names");
}

std::map<std::string, json> timm_files(const ModelConfig& m, const Preprocess& p,
                                       const std::vector<std::string>& class_names) {
  auto refuse = [](const std::string& what) { snapshot_detail::refuse(SnapshotKind::timm, what); };
  json mean = p.mean, std_ = p.std;
  std::map<std::string, json> files;
  const std::string arch = timm_architecture(m);
  if (arch.empty()) {
    const std::string embed = m.embed_norm_layer ? name_of(*m.embed_norm_layer) : "none";
    refuse("norm_layer " + std::string(name_of(m.norm_layer)) + " with layer_norm_eps " + num(m.layer_norm_eps) +
           ", embed_norm_layer " + embed + " and mlp_layer " + name_of(m.mlp_layer) + " in timm's " +
           (m.model_class == ModelClass::eva ? "Eva" : "VisionTransformer") +
           " (no architecture of timm's has them, and model_args cannot say them)");
  }
  if (m.model_class == ModelClass::eva && !m.proj_bias) {
    refuse(VIT_MODEL_KEY(proj_bias) + " false with model_class eva (timm's Eva has no such option)");
  }
  if (m.model_class == ModelClass::eva && m.act_layer != Activation::gelu) {
    refuse(VIT_MODEL_KEY(act_layer) + " " + name_of(m.act_layer) + " with model_class eva (timm's Eva has GELU MLPs)");
  }
  json args =
      write_model_fields(m, [&](const std::string& field) { return is_dropout_rate(field) ? "" : timm_key(m, field); });
  args["img_size"] = json::array({m.img_h, m.img_w});
  if (m.model_class == ModelClass::eva) {
    args["use_fc_norm"] = m.final_norm && m.use_fc_norm();
    args["use_post_transformer_norm"] = m.final_norm && !m.use_fc_norm();
    if (m.ref_feat_h == 0) args["ref_feat_shape"] = nullptr;
  } else {
    args["fc_norm"] = m.use_fc_norm();  // timm's own rule gives the same; written out, it says it
  }
  json cfg = {{"tag", "vit"},
              {"custom_load", false},
              {"input_size", json::array({m.in_chans, m.img_h, m.img_w})},
              {"fixed_input_size", true},
              {"interpolation", name_of(p.interpolation)},
              {"crop_pct", timm_crop_pct(p, m)},
              {"crop_mode", name_of(p.crop_mode)},
              {"mean", mean},
              {"std", std_},
              {"num_classes", m.num_classes},
              {"pool_size", nullptr},
              {"first_conv", "patch_embed.proj"},
              {"classifier", "head"}};
  json config = {{"architecture", arch},
                 {"num_classes", m.num_classes},
                 {"num_features", m.embed_dim},
                 {"global_pool", name_of(m.global_pool)},
                 {"model_args", args},
                 {"pretrained_cfg", cfg}};
  if (!class_names.empty()) config["label_names"] = class_names;
  files["config.json"] = config;
  return files;
}

namespace {

// The fields that say which family a model is of (all but the sizes, the rates and the epsilon), LayerScale as
// present or not and fc_norm as it acts: what timm_architecture counts the differences of.
json family_fields(ModelConfig m) {
  if (m.init_values) m.init_values = 1.0;
  m.fc_norm = m.use_fc_norm();
  const std::set<std::string> sizes = {"img_size",  "patch_size", "in_chans",  "num_classes",
                                       "embed_dim", "depth",      "num_heads", "mlp_ratio"};
  return write_model_fields(m, [&](const std::string& field) {
    return timm_lacks(field) || is_dropout_rate(field) || sizes.count(field) ? "" : field;
  });
}

}  // namespace
}  // namespace snapshot_detail

std::string timm_architecture(const ModelConfig& m) {
  // `create_model` needs a registered name, and model_args carry every other field, so the name matters only for
  // what model_args cannot say: the norms (norm_layer with its epsilon, embed_norm_layer), mlp_layer, and init_values
  // None (create_model drops None). Among the names with the model's epsilon, the model's own preset, else the nearest
  // by family options, patch, width, depth and resolution (a label only).
  const nlohmann::json mine = snapshot_detail::family_fields(m);
  std::string best;
  int64_t best_gap = -1;
  for (const auto& arch : kTimmArchitectures) {
    const ModelConfig p = model_preset(arch.name);
    if (p.model_class != m.model_class) continue;
    if (std::abs(p.layer_norm_eps - m.layer_norm_eps) > 1e-12 * m.layer_norm_eps) continue;
    if (p.norm_layer != m.norm_layer || p.embed_norm_layer != m.embed_norm_layer || p.mlp_layer != m.mlp_layer) {
      continue;
    }
    // timm's create_model drops None arguments, so "no LayerScale" can only come from the name.
    if (!m.init_values && p.init_values) continue;
    if (arch.name == m.preset) return m.preset;
    const nlohmann::json theirs = snapshot_detail::family_fields(p);
    int64_t family = 0;
    for (const auto& [field, value] : mine.items()) family += theirs.at(field) != value;
    const int64_t gap = family * 100000000 + std::abs(p.patch_size - m.patch_size) * 1000000 +
                        std::abs(p.embed_dim - m.embed_dim) * 100 + std::abs(p.depth - m.depth) * 10 +
                        std::abs(p.img_h - m.img_h) + std::abs(p.img_w - m.img_w);
    if (best_gap < 0 || gap < best_gap) best = arch.name, best_gap = gap;
  }
  return best;
}

}  // namespace vit
