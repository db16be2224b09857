// Hugging Face transformers ViT folders (save_pretrained): config.json and preprocessor_config.json to our config
// and back, and their tensor names against ours (HF's separate query, key and value against our fused qkv).
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <stdexcept>

#include "io/snapshot_json.h"
#include "util/fs.h"
#include "util/text.h"

namespace vit {
namespace snapshot_detail {

// A Hugging Face image processor (preprocessor_config.json; an empty object: ViTImageProcessor's defaults) as our
// preprocessing. ViTImageProcessor resizes straight to the model size (crop_pct 1, squash). BitImageProcessor and
// CLIPImageProcessor (their Pil / Fast backends too) resize the shortest edge to size.shortest_edge keeping the
// ratio, or both sides to size.{height, width}, then centre-crop to crop_size with the floor offset: timm's
// eval transform with crop_pct = crop / resized, crop_offset floor. DINOv3ViTImageProcessor resizes straight as
// ViTImageProcessor does, with ImageNet's mean and std (it rescales before resizing, in float: within one 8-bit
// level of PIL's). Anything else fails naming the key.
Preprocess read_hf_processor(const json& pre, const std::string& pre_file, const ModelConfig& m) {
  const auto type_name = get_or<std::string>(pre, "image_processor_type", "ViTImageProcessor", pre_file);
  auto is = [&](const std::string& base) {
    return type_name == base || type_name == base + "Pil" || type_name == base + "Fast";
  };
  const bool dinov3_type = is("DINOv3ViTImageProcessor");
  const bool vit_type = is("ViTImageProcessor") || dinov3_type;
  const bool cropping_type = is("BitImageProcessor") || is("CLIPImageProcessor");
  if (!vit_type && !cropping_type) {
    fail(pre_file, "image_processor_type \"" + type_name +
                       "\" is not supported (vit reads ViTImageProcessor, BitImageProcessor, CLIPImageProcessor and "
                       "DINOv3ViTImageProcessor)");
  }
  if (dinov3_type && get_or<bool>(pre, "do_center_crop", false, pre_file)) {
    fail(pre_file, "do_center_crop true is not supported for DINOv3ViTImageProcessor (vit resizes straight to size)");
  }
  const std::string model_size = size_text(m.img_h, m.img_w);
  Preprocess p;
  if (dinov3_type) {  // its class defaults
    p.mean = {0.485, 0.456, 0.406}, p.std = {0.229, 0.224, 0.225};
    p.interpolation = Interpolation::bilinear;
  } else if (vit_type) {
    p.mean = {0.5, 0.5, 0.5}, p.std = {0.5, 0.5, 0.5};
    p.interpolation = Interpolation::bilinear;
  } else {  // BiT's and CLIP's: OpenAI CLIP's mean and std, bicubic
    p.mean = {0.48145466, 0.4578275, 0.40821073}, p.std = {0.26862954, 0.26130258, 0.27577711};
    p.interpolation = Interpolation::bicubic;
  }
  p.crop_mode = CropMode::squash;
  p.crop_pct = 1.0;
  if (!get_or<bool>(pre, "do_resize", true, pre_file)) {
    fail(pre_file, "do_resize false is not supported (the model needs " + model_size + " inputs)");
  }
  auto given = [&](const char* key, const json& otherwise) {
    return pre.contains(key) && !pre[key].is_null() ? pre[key] : otherwise;
  };
  // Without a size, ViTImageProcessor is taken at the model's (as before files had one); BiT / CLIP at the class's.
  const json size = given("size", vit_type ? json{{"height", m.img_h}, {"width", m.img_w}} : json{{"shortest_edge", 224}});
  auto side = [&](const json& object, const char* key) {
    const json v = object.is_object() ? object.value(key, json()) : json();
    return v.is_number_integer() && v.get<int64_t>() > 0 ? v.get<int64_t>() : int64_t{-1};
  };
  const int64_t shortest = side(size, "shortest_edge");
  int64_t resize_h = side(size, "height"), resize_w = side(size, "width");
  if (size.is_number_integer()) resize_h = resize_w = size.get<int64_t>();  // older files: one number
  if (shortest < 0 && (resize_h < 0 || resize_w < 0)) {
    fail(pre_file, "size " + show(size) + " is neither {\"height\", \"width\"} nor {\"shortest_edge\"}");
  }
  const bool crop = cropping_type && get_or<bool>(pre, "do_center_crop", true, pre_file);
  if (!crop) {
    if (shortest > 0 || resize_h != m.img_h || resize_w != m.img_w) {
      fail(pre_file, "size " + show(size) + " differs from the model's image_size " + model_size +
                         " and nothing crops it (vit reads size as {\"height\", \"width\"})");
    }
  } else {
    const json crop_size = given("crop_size", json{{"height", 224}, {"width", 224}});
    int64_t crop_h = side(crop_size, "height"), crop_w = side(crop_size, "width");
    if (crop_size.is_number_integer()) crop_h = crop_w = crop_size.get<int64_t>();
    if (crop_h != m.img_h || crop_w != m.img_w) {
      fail(pre_file, "crop_size " + show(crop_size) + " differs from the model's image_size " + model_size);
    }
    p.crop_offset = CropOffset::floor;
    if (shortest > 0) {
      // The shorter side to `shortest`, the other keeping the ratio (int(shortest * long / short)), as timm's
      // crop_mode center resizes for a square model.
      if (m.img_h != m.img_w) {
        fail(pre_file, "size.shortest_edge with the rectangular crop_size " + model_size +
                           " is not supported (timm resizes a rectangle by another rule: ResizeKeepRatio)");
      }
      if (shortest < m.img_h) {
        fail(pre_file, "size.shortest_edge " + std::to_string(shortest) + " is smaller than crop_size " + model_size);
      }
      p.crop_mode = CropMode::center;
      p.crop_pct = static_cast<double>(m.img_h) / static_cast<double>(shortest);
    } else {
      // Both sides to (resize_h, resize_w), then the crop: squash with one crop_pct for both sides.
      p.crop_pct = static_cast<double>(m.img_h) / static_cast<double>(resize_h);
      if (resize_h < m.img_h || resize_w < m.img_w || eval_scale(m.img_w, p.crop_pct) != resize_w) {
        fail(pre_file, "size " + show(size) + " and crop_size " + model_size +
                           " crop the two sides by different fractions, which vit's one crop_pct cannot hold");
      }
    }
  }
  if (pre.contains("resample")) p.interpolation = interpolation_from(pre["resample"], pre_file, "resample");
  const bool rescale = get_or<bool>(pre, "do_rescale", true, pre_file);
  const double factor = get_or<double>(pre, "rescale_factor", 1.0 / 255.0, pre_file);
  if (!rescale || std::abs(factor * 255.0 - 1.0) > 1e-9) {
    fail(pre_file, "rescale other than x / 255 is not supported (do_rescale " + std::string(rescale ? "true" : "false") +
                       ", rescale_factor " + num(factor) + ")");
  }
  if (get_or<bool>(pre, "do_normalize", true, pre_file)) {
    if (pre.contains("image_mean")) p.mean = numbers(pre["image_mean"], pre_file, "image_mean");
    if (pre.contains("image_std")) p.std = numbers(pre["image_std"], pre_file, "image_std");
  } else {
    p.mean = {0.0}, p.std = {1.0};
  }
  return p;
}

namespace {

// Hugging Face's ViTConfig keys for the model fields it spells as a field. It holds three more in its own form
// (mlp_ratio as intermediate_size, act_layer as hidden_act, num_classes as id2label); the dropout rates are training's.
std::string hf_key(const std::string& field) {
  static const std::map<std::string, std::string> keys = {
      {"embed_dim", "hidden_size"}, {"depth", "num_hidden_layers"}, {"num_heads", "num_attention_heads"},
      {"img_size", "image_size"},   {"patch_size", "patch_size"},   {"in_chans", "num_channels"},
      {"qkv_bias", "qkv_bias"},     {"layer_norm_eps", "layer_norm_eps"},
  };
  const auto it = keys.find(field);
  return it == keys.end() ? "" : it->second;
}
bool hf_in_own_form(const std::string& field) {
  return field == "preset" || field == "mlp_ratio" || field == "act_layer" || field == "num_classes" ||
         is_dropout_rate(field);
}

// The fields HF's ViT cannot hold where they differ from its fixed ones (our defaults), in words.
std::vector<std::string> hf_cannot_hold(ModelConfig m) {
  if (m.fc_norm && *m.fc_norm == (m.global_pool == GlobalPool::avg)) m.fc_norm.reset();  // the rule's value
  auto fixed = [](const std::string& field) { return hf_key(field).empty() && !hf_in_own_form(field) ? field : ""; };
  const json mine = write_model_fields(m, fixed), hf = write_model_fields(ModelConfig{}, fixed);
  const std::map<std::string, std::string> words = {
      {"class_token", "a model without a class token (model.class_token false)"},
      {"init_values", "LayerScale (model.init_values)"},
      {"reg_tokens", "register tokens (model.reg_tokens)"},
      {"no_embed_class", "a position embedding without the class slot (model.no_embed_class)"},
      {"pre_norm", "pre_norm (CLIP's norm before the blocks)"},
      {"final_norm", "a final norm other than HF's layernorm on every token (model.final_norm false)"},
      {"fc_norm", "a final norm other than HF's layernorm on every token (model.fc_norm)"},
  };
  std::vector<std::string> out;
  for (const auto& [field, value] : mine.items()) {
    if (value == hf.at(field)) continue;
    if (field == "global_pool") {
      out.push_back("global_pool " + show(value) + " (HF's ViT reads the class token)");
    } else if (const auto it = words.find(field); it != words.end()) {
      out.push_back(it->second);
    } else {
      out.push_back("model." + field + " " + show(value) + " (HF's ViT has no such option)");
    }
  }
  return out;
}

}  // namespace

void read_hf(const json& config, Snapshot& s) {
  const std::string file = s.dir + "/config.json";
  const std::string type = get_or<std::string>(config, "model_type", "", file);
  if (type == "dinov3_vit") return read_hf_dinov3(config, s);
  if (type != "vit") {
    std::string why = type == "deit" ? ": DeiT's distillation token is not supported"
                                     : ": vit reads Hugging Face's ViT and DINOv3 (model_type \"vit\", \"dinov3_vit\")";
    fail(file, "model_type \"" + type + "\" is not supported" + why);
  }
  const json archs = config.value("architectures", json::array());
  for (const auto& a : archs) {
    const std::string name = a.is_string() ? a.get<std::string>() : a.dump();
    if (name != "ViTForImageClassification" && name != "ViTModel") {
      fail(file, "architectures: " + name + " is not supported (vit reads ViTForImageClassification and ViTModel)");
    }
  }
  // Every field HF's ViT does not spell is at our default, which is HF's ViT (class token, token pooling, ...).
  ModelConfig& m = s.model;
  m = ModelConfig{};
  m.layer_norm_eps = 1e-12;  // ViTConfig's default; its others are ours
  read_fields(config, "", file, hf_key, m);  // its other keys are HF's own (id2label, dropout rates, ...)
  const auto intermediate = get_or<int64_t>(config, "intermediate_size", 3072, file);
  m.mlp_ratio = static_cast<double>(intermediate) / static_cast<double>(m.embed_dim);
  if (static_cast<int64_t>(m.embed_dim * m.mlp_ratio) != intermediate) {
    fail(file, "intermediate_size " + std::to_string(intermediate) + " is not a whole multiple of hidden_size");
  }
  const auto act = get_or<std::string>(config, "hidden_act", "gelu", file);
  if (act != "gelu") fail(file, "hidden_act \"" + act + "\" is not supported (vit's MLP uses exact GELU, \"gelu\")");
  const json id2label = config.value("id2label", json::object());
  if (!id2label.is_object()) fail(file, "id2label: not an object");
  // Without "architectures", a folder with class labels is taken for a classifier.
  bool classifier = archs.empty() && !id2label.empty();
  for (const auto& a : archs) classifier = classifier || a == "ViTForImageClassification";
  // id2label maps "0".."n-1" to names; a ViTModel (features only) has no classifier.
  m.num_classes = classifier ? static_cast<int64_t>(id2label.size()) : 0;
  if (classifier && m.num_classes == 0) m.num_classes = 2;  // PretrainedConfig's default num_labels
  s.sources.emplace_back("model", "config.json: Hugging Face ViT (" +
                                      std::string(classifier ? "ViTForImageClassification" : "ViTModel") + ")");
  if (classifier && !id2label.empty()) {
    s.class_names.assign(m.num_classes, "");
    for (const auto& [key, value] : id2label.items()) {
      const auto index = class_index(key, m.num_classes);
      if (index < 0) fail(file, "id2label: key \"" + key + "\" is not a class index");
      s.class_names[index] = value.is_string() ? value.get<std::string>() : value.dump();
    }
    s.sources.emplace_back("class_names", "config.json: id2label");
  }

  const std::string pre_file = s.dir + "/preprocessor_config.json";
  if (file_exists(pre_file)) {
    const json pre = read_json(pre_file);
    s.preprocess = read_hf_processor(pre, pre_file, m);
    s.sources.emplace_back("preprocess", "preprocessor_config.json: " +
                                             get_or<std::string>(pre, "image_processor_type", "ViTImageProcessor",
                                                                 pre_file));
  } else {
    s.preprocess = read_hf_processor(json::object(), pre_file, m);
    s.sources.emplace_back("preprocess", "ViTImageProcessor's defaults (no preprocessor_config.json)");
  }
}

std::map<std::string, json> hf_files(const ModelConfig& m, const Preprocess& p,
                                     const std::vector<std::string>& class_names) {
  auto refuse = [](const std::string& what) { snapshot_detail::refuse(SnapshotKind::hf, what); };
  json mean = p.mean, std_ = p.std;
  std::map<std::string, json> files;
  // Hugging Face's ViTForImageClassification: class token, token pooling, no LayerScale, square-free sizes.
  if (const auto cannot = hf_cannot_hold(m); !cannot.empty()) {
    std::string list;
    for (const auto& what : cannot) list += (list.empty() ? "" : "; ") + what;
    refuse(list);
  }
  if (m.act_layer != Activation::gelu) refuse(std::string("act_layer ") + name_of(m.act_layer) + " (vit writes exact GELU)");
  if (m.num_classes <= 0) refuse("a model without a classifier head (num_classes 0)");
  const double hidden = m.embed_dim * m.mlp_ratio;
  if (hidden != std::floor(hidden)) refuse("mlp_ratio " + num(m.mlp_ratio) + " (not a whole MLP width)");
  const bool crops = p.crop_pct != 1.0 || p.crop_mode != CropMode::squash;
  if (crops && p.crop_mode == CropMode::center && m.img_h != m.img_w) {
    refuse("crop_mode center at the rectangular size " + size_text(m.img_h, m.img_w) +
           " (timm resizes until both sides cover it, keeping the ratio: no transformers processor resizes so)");
  }
  json id2label = json::object(), label2id = json::object();
  for (int64_t i = 0; i < m.num_classes; ++i) {
    const std::string name = i < static_cast<int64_t>(class_names.size()) ? class_names[i] : std::to_string(i);
    id2label[std::to_string(i)] = name;
    label2id[name] = i;
  }
  json config = write_model_fields(m, hf_key);
  config.update({{"architectures", {"ViTForImageClassification"}},
                 {"model_type", "vit"},
                 {"intermediate_size", static_cast<int64_t>(hidden)},
                 {"hidden_act", "gelu"},
                 {"hidden_dropout_prob", 0.0},
                 {"attention_probs_dropout_prob", 0.0},
                 {"initializer_range", 0.02},
                 {"encoder_stride", m.patch_size},
                 {"id2label", id2label},
                 {"label2id", label2id},
                 {"dtype", "float32"}});
  files["config.json"] = config;
  const int resample = p.interpolation == Interpolation::bicubic ? 3 : 2;
  if (crops) {
    // timm's eval transform as BitImageProcessor: the shorter side (center) or both sides (squash) to
    // floor(size / crop_pct), then the centre crop, whose odd pixel transformers puts by floor where timm rounds.
    const int64_t scale_h = eval_scale(m.img_h, p.crop_pct), scale_w = eval_scale(m.img_w, p.crop_pct);
    const json size = p.crop_mode == CropMode::center ? json{{"shortest_edge", scale_h}}
                                                      : json{{"height", scale_h}, {"width", scale_w}};
    files["preprocessor_config.json"] = {{"image_processor_type", "BitImageProcessor"},
                                         {"do_resize", true},
                                         {"size", size},
                                         {"resample", resample},
                                         {"do_center_crop", true},
                                         {"crop_size", {{"height", m.img_h}, {"width", m.img_w}}},
                                         {"do_rescale", true},
                                         {"rescale_factor", 1.0 / 255.0},
                                         {"do_normalize", true},
                                         {"image_mean", mean},
                                         {"image_std", std_},
                                         {"do_convert_rgb", true}};
    return files;
  }
  files["preprocessor_config.json"] = {{"image_processor_type", "ViTImageProcessor"},
                                       {"do_resize", true},
                                       {"size", {{"height", m.img_h}, {"width", m.img_w}}},
                                       {"resample", resample},
                                       {"do_rescale", true},
                                       {"rescale_factor", 1.0 / 255.0},
                                       {"do_normalize", true},
                                       {"image_mean", mean},
                                       {"image_std", std_}};
  return files;
}

}  // namespace snapshot_detail

namespace {

// The one table of our names against Hugging Face's, both directions read it. Outside the blocks: exact names, or
// prefixes (ending in '.') followed by weight/bias. Inside block N ("blocks.N." / "vit.encoder.layer.N."): prefixes;
// the fused qkv is HF's query, key and value (hf_qkv_names).
const std::vector<std::pair<std::string, std::string>>& hf_top_names() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"cls_token", "vit.embeddings.cls_token"},
      {"pos_embed", "vit.embeddings.position_embeddings"},
      {"patch_embed.proj.", "vit.embeddings.patch_embeddings.projection."},
      {"norm.", "vit.layernorm."},
      {"head.", "classifier."},
  };
  return names;
}
const std::vector<std::pair<std::string, std::string>>& hf_block_names() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"norm1.", "layernorm_before."},       {"attn.proj.", "attention.output.dense."},
      {"norm2.", "layernorm_after."},        {"mlp.fc1.", "intermediate.dense."},
      {"mlp.fc2.", "output.dense."},
  };
  return names;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

std::string hf_name(const std::string& ours) {
  for (const auto& [mine, theirs] : hf_top_names()) {
    if (auto out = snapshot_detail::renamed(ours, mine, theirs); !out.empty()) return out;
  }
  if (starts_with(ours, "blocks.")) {
    const auto dot = ours.find('.', 7);
    const std::string index = ours.substr(7, dot - 7), rest = ours.substr(dot + 1);
    for (const auto& [mine, theirs] : hf_block_names()) {
      if (auto out = snapshot_detail::renamed(rest, mine, theirs); !out.empty())
        return "vit.encoder.layer." + index + "." + out;
    }
  }
  return "";
}

std::vector<std::string> hf_qkv_names(const std::string& ours) {
  // blocks.N.attn.qkv.{weight,bias}
  const auto dot = ours.find('.', 7);
  const std::string index = ours.substr(7, dot - 7);
  const std::string kind = ours.substr(ours.rfind('.') + 1);
  std::vector<std::string> out;
  for (const char* part : {"query", "key", "value"}) {
    out.push_back("vit.encoder.layer." + index + ".attention.attention." + part + "." + kind);
  }
  return out;
}

std::map<std::string, std::vector<std::string>> snapshot_names(SnapshotKind kind, const ModelConfig& model,
                                                               const std::vector<std::string>& theirs,
                                                               const std::string& path) {
  using snapshot_detail::fail;
  std::map<std::string, std::vector<std::string>> out;
  if (kind == SnapshotKind::timm) {
    for (const auto& name : theirs) out[name] = {name};
    return out;
  }
  // Hugging Face's layouts: DINOv3ViTModel's (read as timm's Eva), else ViT's.
  if (model.model_class == ModelClass::eva) return snapshot_detail::dinov3_names(model, theirs, path);
  std::vector<std::string> unknown;
  std::map<std::string, std::array<std::string, 3>> qkv;
  for (const auto& full : theirs) {
    // ViTForImageClassification nests the backbone under "vit."; a ViTModel saves it at the top.
    const std::string name = starts_with(full, "vit.") || starts_with(full, "classifier.") ? full : "vit." + full;
    std::string ours;
    for (const auto& [mine, hf] : hf_top_names()) {
      if (ours.empty()) ours = snapshot_detail::renamed(name, hf, mine);
    }
    if (starts_with(name, "vit.pooler.") || name == "vit.embeddings.mask_token") {
      continue;  // ViTModel's pooler and the masked-image-modelling token: classification never reads them
    }
    const std::string layer = "vit.encoder.layer.";
    if (ours.empty() && starts_with(name, layer)) {
      const auto dot = name.find('.', layer.size());
      const std::string index = name.substr(layer.size(), dot == std::string::npos ? 0 : dot - layer.size());
      const std::string rest = dot == std::string::npos ? "" : name.substr(dot + 1);
      const std::string block = "blocks." + index + ".";
      int part = -1;
      const char* parts[] = {"attention.attention.query.", "attention.attention.key.", "attention.attention.value."};
      for (int i = 0; i < 3; ++i) {
        if (starts_with(rest, parts[i])) part = i;
      }
      if (part >= 0) {
        qkv[block + "attn.qkv." + rest.substr(std::strlen(parts[part]))][part] = full;
        continue;
      }
      for (const auto& [mine, hf] : hf_block_names()) {
        if (auto out = snapshot_detail::renamed(rest, hf, mine); !out.empty()) ours = block + out;
      }
    }
    if (ours.empty()) {
      unknown.push_back(full);
    } else {
      out[ours] = {full};
    }
  }
  for (const auto& [ours, parts] : qkv) {
    for (const auto& part : parts) {
      if (part.empty()) fail(path, "has only some of the query, key and value tensors of " + ours);
    }
    out[ours] = {parts[0], parts[1], parts[2]};
  }
  if (!unknown.empty()) snapshot_detail::fail_unknown_tensors(path, "a Hugging Face ViT", unknown);
  return out;
}

}  // namespace vit
