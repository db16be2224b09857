// timm and Hugging Face snapshot folders: their JSON files to our configs and back, their tensor names to ours.
#include "io/snapshot.h"

#include <sys/stat.h>

#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "config/timm_architectures.h"
#include "data/image.h"
#include "util/fs.h"

namespace vit {
using nlohmann::json;

namespace {

[[noreturn]] void fail(const std::string& file, const std::string& what) { throw std::runtime_error(file + ": " + what); }

json read_json(const std::string& path) {
  const json doc = json::parse(read_file(path), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) fail(path, "not a JSON object");
  return doc;
}

std::string show(const json& value) { return value.dump(); }

// Sharded weights, as transformers' save_pretrained and timm's push_to_hub write them above their size limit: an index
// {"weight_map": {tensor: file}} beside the shards. Each file must be a plain name in the folder (never a path
// elsewhere).
std::map<std::string, std::string> read_shard_index(const std::string& index, const std::string& dir) {
  const json doc = read_json(index);
  const auto map = doc.find("weight_map");
  if (map == doc.end() || !map->is_object() || map->empty()) {
    fail(index, "no \"weight_map\" object naming the file of each tensor");
  }
  std::map<std::string, std::string> out;
  for (const auto& [name, file] : map->items()) {
    const std::string shard = file.is_string() ? file.get<std::string>() : "";
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos) {
      fail(index, "weight_map names " + show(file) + " for " + show(name) + ": not the name of a file in the folder");
    }
    out[name] = dir + "/" + shard;
  }
  return out;
}
std::string num(double value) { return json(value).dump(); }

// The value at `key` as T, or `fallback` when absent or null; a wrong type fails naming the key.
template <typename T>
T get_or(const json& doc, const std::string& key, const T& fallback, const std::string& file) {
  auto it = doc.find(key);
  if (it == doc.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    fail(file, key + ": " + show(*it) + " has the wrong type");
  }
}

const char* const kPickleNames[] = {"pytorch_model.bin", "model.bin", "open_clip_pytorch_model.bin", "model.pth",
                                    "checkpoint.pth", "model.pt"};

bool starts_like_pickle(const std::string& path) {
  std::error_code error;  // anything but a regular file is refused by the reader, with its kind named
  if (!std::filesystem::is_regular_file(path, error)) return false;
  std::ifstream in(path, std::ios::binary);
  unsigned char head[8] = {};
  in.read(reinterpret_cast<char*>(head), 8);
  if (in.gcount() < 8) return false;
  // A safetensors file opens with its header length, a little-endian u64 below 100 MB: bytes 4..7 are zero, and
  // bytes 0..1 may well read 0x80 0x02 (a 640-byte header). A zip's local header (version, flags) and a pickle's
  // opening opcodes do not leave them zero.
  if (head[4] == 0 && head[5] == 0 && head[6] == 0 && head[7] == 0) return false;
  // torch.save: a zip archive ("PK\3\4") or, before PyTorch 1.6, a raw pickle (protocol 2+: 0x80 then 2..5).
  return (head[0] == 'P' && head[1] == 'K' && head[2] == 3 && head[3] == 4) ||
         (head[0] == 0x80 && head[1] >= 2 && head[1] <= 5);
}

// The resize filter of a PIL resample code (preprocessor_config.json) or a timm interpolation name.
Interpolation interpolation_from(const json& value, const std::string& file, const std::string& key) {
  if (value.is_number_integer()) {
    const int code = value.get<int>();
    if (code == 2) return Interpolation::bilinear;
    if (code == 3) return Interpolation::bicubic;
    const char* names[] = {"NEAREST", "LANCZOS", "BILINEAR", "BICUBIC", "BOX", "HAMMING"};
    fail(file, key + ": " + std::to_string(code) + " (PIL " + (code >= 0 && code <= 5 ? names[code] : "unknown") +
                   ") is not supported; vit resizes with BILINEAR (2) or BICUBIC (3)");
  }
  if (value.is_string()) {
    const auto name = value.get<std::string>();
    if (name == "bilinear") return Interpolation::bilinear;
    if (name == "bicubic") return Interpolation::bicubic;
    fail(file, key + ": \"" + name + "\" is not supported; vit resizes with bilinear or bicubic");
  }
  fail(file, key + ": " + show(value) + " is not an interpolation");
}

// "3" -> 3 when it is a whole index below `count`, else -1.
int64_t class_index(const std::string& key, int64_t count) {
  if (key.empty() || key.size() > 9 || key.find_first_not_of("0123456789") != std::string::npos) return -1;
  const int64_t index = std::stoll(key);
  return index < count ? index : -1;
}

std::vector<double> numbers(const json& value, const std::string& file, const std::string& key) {
  if (value.is_number()) return {value.get<double>()};
  if (!value.is_array() || value.empty()) fail(file, key + ": " + show(value) + " is not a list of numbers");
  std::vector<double> out;
  for (const auto& v : value) {
    if (!v.is_number()) fail(file, key + ": " + show(value) + " is not a list of numbers");
    out.push_back(v.get<double>());
  }
  return out;
}

// ---- timm ----

// model_args of timm's VisionTransformer we read, and the options we lack with the value that means "off".
void apply_timm_model_args(const json& args, ModelConfig& m, const std::string& file) {
  if (!args.is_object()) fail(file, "model_args: " + show(args) + " is not an object");
  // Options of timm's VisionTransformer that change the architecture, each accepted only at its plain-ViT value.
  const std::map<std::string, json> plain = {
      {"dynamic_img_pad", false},  {"norm_layer", "layernorm"}, {"embed_layer", "PatchEmbed"}, {"block_fn", "Block"},
      {"mlp_layer", "Mlp"},        {"patch_bias", true},        {"ignore_head", false},        {"attn_layer", "attn"},
      {"proj_bias", true},         {"pool_include_prefix", false}, {"pos_embed", "learn"},   {"scale_attn_norm", false},
      {"scale_mlp_norm", false},   {"embed_norm_layer", nullptr},
  };
  // Options that do not change the weights or the inference result. dynamic_img_size: vit runs every size divisible
  // by the patch, resampling the position embedding as timm's dynamic_img_size does.
  const std::set<std::string> harmless = {"weight_init", "fix_init", "pos_drop_rate", "patch_drop_rate",
                                          "pretrained_cfg_overlay", "dynamic_img_size"};
  for (const auto& item : args.items()) {
    // Not a structured binding: C++17 lambdas cannot capture one (clang refuses; the sanitizer build uses clang).
    const std::string& key = item.key();
    const json& value = item.value();
    const std::string where = "model_args." + key;
    auto number = [&]() -> double {
      if (!value.is_number()) fail(file, where + ": " + show(value) + " is not a number");
      return value.get<double>();
    };
    auto count = [&]() -> int64_t {
      if (!value.is_number_integer()) fail(file, where + ": " + show(value) + " is not an integer");
      return value.get<int64_t>();
    };
    auto flag = [&]() -> bool {
      if (!value.is_boolean()) fail(file, where + ": " + show(value) + " is not true or false");
      return value.get<bool>();
    };
    if (key == "img_size") {
      if (value.is_number_integer()) {
        m.img_h = m.img_w = value.get<int64_t>();
      } else if (value.is_array() && value.size() == 2 && value[0].is_number_integer() &&
                 value[1].is_number_integer()) {
        m.img_h = value[0].get<int64_t>(), m.img_w = value[1].get<int64_t>();
      } else {
        fail(file, where + ": " + show(value) + " is not a size");
      }
    } else if (key == "patch_size") {
      if (value.is_array() && value.size() == 2 && value[0] == value[1]) {
        m.patch_size = value[0].get<int64_t>();
      } else {
        m.patch_size = count();
      }
    } else if (key == "in_chans") {
      m.in_chans = count();
    } else if (key == "num_classes") {
      m.num_classes = count();
    } else if (key == "embed_dim") {
      m.embed_dim = count();
    } else if (key == "depth") {
      m.depth = count();
    } else if (key == "num_heads") {
      m.num_heads = count();
    } else if (key == "mlp_ratio") {
      m.mlp_ratio = number();
    } else if (key == "qkv_bias") {
      m.qkv_bias = flag();
    } else if (key == "class_token") {
      m.class_token = flag();
    } else if (key == "reg_tokens") {
      m.reg_tokens = count();
    } else if (key == "no_embed_class") {
      m.no_embed_class = flag();
    } else if (key == "pre_norm") {
      m.pre_norm = flag();
    } else if (key == "final_norm") {
      m.final_norm = flag();
    } else if (key == "qk_norm") {
      m.qk_norm = flag();
    } else if (key == "act_layer") {
      const std::string act = value.is_string() ? value.get<std::string>() : show(value);
      auto parsed = enum_from_name<Activation>(act);
      if (!parsed) fail(file, where + ": \"" + act + "\" is not supported (vit has " + enum_choices<Activation>() + ")");
      m.act_layer = *parsed;
    } else if (key == "global_pool") {
      const std::string pool = value.is_string() ? value.get<std::string>() : show(value);
      auto parsed = enum_from_name<GlobalPool>(pool);
      if (!parsed) fail(file, where + ": \"" + pool + "\" is not supported (vit pools with " + enum_choices<GlobalPool>() + ")");
      m.global_pool = *parsed;
    } else if (key == "init_values") {
      if (value.is_null()) {
        m.init_values.reset();
      } else {
        m.init_values = number();
      }
    } else if (key == "drop_rate") {
      m.drop_rate = number();
    } else if (key == "attn_drop_rate") {
      m.attn_drop_rate = number();
    } else if (key == "proj_drop_rate") {
      m.proj_drop_rate = number();
    } else if (key == "drop_path_rate") {
      m.drop_path_rate = number();
    } else if (key == "fc_norm") {
      if (value.is_null()) {
        m.fc_norm.reset();
      } else {
        m.fc_norm = flag();
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
  if (has("giant") && has("dinov2")) return "a SwiGLU MLP (DINOv2 giant)";
  if (has("aimv2")) return "RMSNorm and a SwiGLU MLP (AIMv2)";
  if (has("beit3")) return "norms inside attention and MLP (BEiT-3)";
  if (has("_xp_") || has("18x2") || has("rpn") || has("pwee")) return "parallel or residual-post-norm blocks";
  if (has("dwee") || has("dlittle")) return "differential attention";
  if (has("so400m_patch14") && has("_384")) return "an input size that is not a whole number of patches (384 / 14)";
  if (has("eva") || has("beit")) return "rotary or relative position embeddings (timm's EVA and BEiT classes)";
  return "";
}

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

// The crop_pct to write for timm, which computes floor(size / crop_pct) without our slack (eval_scale): one read from
// a Hugging Face processor as size / resized can land just under `resized` there (48 / (48 / 54) in some sizes), so
// such a crop_pct is written as size / (resized + 0.5), which gives `resized` back either way.
double timm_crop_pct(const Preprocess& p, const ModelConfig& m) {
  const int64_t resized = eval_scale(m.img_h, p.crop_pct);
  if (std::floor(static_cast<double>(m.img_h) / p.crop_pct) == static_cast<double>(resized)) return p.crop_pct;
  return static_cast<double>(m.img_h) / (static_cast<double>(resized) + 0.5);
}

// ---- Hugging Face ----

// A Hugging Face image processor (preprocessor_config.json; an empty object: ViTImageProcessor's defaults) as our
// preprocessing. ViTImageProcessor resizes straight to the model size (crop_pct 1, squash). BitImageProcessor and
// CLIPImageProcessor (their Pil / Fast backends too) resize the shortest edge to size.shortest_edge keeping the
// ratio, or both sides to size.{height, width}, then centre-crop to crop_size with the floor offset: timm's
// eval transform with crop_pct = crop / resized, crop_offset floor. Anything else fails naming the key.
Preprocess read_hf_processor(const json& pre, const std::string& pre_file, const ModelConfig& m) {
  const auto type_name = get_or<std::string>(pre, "image_processor_type", "ViTImageProcessor", pre_file);
  auto is = [&](const std::string& base) {
    return type_name == base || type_name == base + "Pil" || type_name == base + "Fast";
  };
  const bool vit_type = is("ViTImageProcessor");
  const bool cropping_type = is("BitImageProcessor") || is("CLIPImageProcessor");
  if (!vit_type && !cropping_type) {
    fail(pre_file, "image_processor_type \"" + type_name +
                       "\" is not supported (vit reads ViTImageProcessor, BitImageProcessor and CLIPImageProcessor)");
  }
  const std::string model_size = std::to_string(m.img_h) + "x" + std::to_string(m.img_w);
  Preprocess p;
  if (vit_type) {  // its class defaults
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


void read_hf(const json& config, Snapshot& s) {
  const std::string file = s.dir + "/config.json";
  const std::string type = get_or<std::string>(config, "model_type", "", file);
  if (type != "vit") {
    std::string why = type == "deit" ? ": DeiT's distillation token is not supported"
                                     : ": vit reads Hugging Face's ViT (model_type \"vit\")";
    fail(file, "model_type \"" + type + "\" is not supported" + why);
  }
  const json archs = config.value("architectures", json::array());
  for (const auto& a : archs) {
    const std::string name = a.is_string() ? a.get<std::string>() : a.dump();
    if (name != "ViTForImageClassification" && name != "ViTModel") {
      fail(file, "architectures: " + name + " is not supported (vit reads ViTForImageClassification and ViTModel)");
    }
  }
  ModelConfig& m = s.model;
  m.embed_dim = get_or<int64_t>(config, "hidden_size", 768, file);
  m.depth = get_or<int64_t>(config, "num_hidden_layers", 12, file);
  m.num_heads = get_or<int64_t>(config, "num_attention_heads", 12, file);
  const auto intermediate = get_or<int64_t>(config, "intermediate_size", 3072, file);
  m.mlp_ratio = static_cast<double>(intermediate) / static_cast<double>(m.embed_dim);
  if (static_cast<int64_t>(m.embed_dim * m.mlp_ratio) != intermediate) {
    fail(file, "intermediate_size " + std::to_string(intermediate) + " is not a whole multiple of hidden_size");
  }
  const auto act = get_or<std::string>(config, "hidden_act", "gelu", file);
  if (act != "gelu") fail(file, "hidden_act \"" + act + "\" is not supported (vit's MLP uses exact GELU, \"gelu\")");
  m.layer_norm_eps = get_or<double>(config, "layer_norm_eps", 1e-12, file);
  const json size = config.value("image_size", json(224));
  if (size.is_number_integer()) {
    m.img_h = m.img_w = size.get<int64_t>();
  } else if (size.is_array() && size.size() == 2) {
    m.img_h = size[0].get<int64_t>(), m.img_w = size[1].get<int64_t>();
  } else {
    fail(file, "image_size: " + show(size) + " is not a size");
  }
  m.patch_size = get_or<int64_t>(config, "patch_size", 16, file);
  m.in_chans = get_or<int64_t>(config, "num_channels", 3, file);
  m.qkv_bias = get_or<bool>(config, "qkv_bias", true, file);
  m.class_token = true;
  m.global_pool = GlobalPool::token;
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

}  // namespace

bool is_snapshot_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void refuse_pickle(const std::string& path) {
  const std::string ext = lower_extension(path);
  const bool by_name = ext == ".bin" || ext == ".pth" || ext == ".pt" || ext == ".ckpt" || ext == ".pkl";
  if (!by_name && !starts_like_pickle(path)) return;
  throw std::runtime_error(
      path + ": a pickle checkpoint (torch.save), which vit never unpickles (it can run code); convert it to "
             "safetensors: python -c \"import torch, safetensors.torch as s; s.save_file(torch.load('" +
      path + "', weights_only=True), 'model.safetensors')\"");
}

Snapshot read_snapshot(const std::string& dir) {
  Snapshot s;
  s.dir = dir;
  while (s.dir.size() > 1 && s.dir.back() == '/') s.dir.pop_back();
  const std::string config_path = s.dir + "/config.json";
  if (!file_exists(config_path)) {
    fail(s.dir, "a folder without config.json (vit reads timm and Hugging Face snapshot folders, or a model file)");
  }
  const json config = read_json(config_path);
  s.weights = s.dir + "/model.safetensors";
  if (!file_exists(s.weights) && file_exists(s.dir + "/model.safetensors.index.json")) {
    s.weights = s.dir + "/model.safetensors.index.json";
    s.shard_of = read_shard_index(s.weights, s.dir);
  } else if (!file_exists(s.weights)) {
    for (const char* name : kPickleNames) {
      if (file_exists(s.dir + "/" + name)) refuse_pickle(s.dir + "/" + name);
    }
    fail(s.dir, "no model.safetensors (nor model.safetensors.index.json) beside config.json");
  }
  if (config.contains("architecture")) {
    s.kind = SnapshotKind::timm;
    read_timm(config, s);
  } else if (config.contains("model_type")) {
    s.kind = SnapshotKind::hf;
    read_hf(config, s);
  } else {
    fail(config_path, "neither a timm config (\"architecture\") nor a Hugging Face one (\"model_type\")");
  }
  try {
    validate(s.model, config_path);
    s.preprocess = parse_preprocess(to_json(s.preprocess), config_path);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());
  }
  if (!s.class_names.empty() && static_cast<int64_t>(s.class_names.size()) != s.model.num_classes) {
    fail(config_path, std::to_string(s.class_names.size()) + " class names for " +
                          std::to_string(s.model.num_classes) + " classes");
  }
  return s;
}

// ---- tensor names ----

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

// `name` with `from` (an exact name, or a prefix ending in '.') replaced by `to`; "" when it does not match.
std::string rename(const std::string& name, const std::string& from, const std::string& to) {
  if (from.back() == '.') return name.rfind(from, 0) == 0 ? to + name.substr(from.size()) : "";
  return name == from ? to : "";
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

std::string hf_name(const std::string& ours) {
  for (const auto& [mine, theirs] : hf_top_names()) {
    if (auto out = rename(ours, mine, theirs); !out.empty()) return out;
  }
  if (starts_with(ours, "blocks.")) {
    const auto dot = ours.find('.', 7);
    const std::string index = ours.substr(7, dot - 7), rest = ours.substr(dot + 1);
    for (const auto& [mine, theirs] : hf_block_names()) {
      if (auto out = rename(rest, mine, theirs); !out.empty()) return "vit.encoder.layer." + index + "." + out;
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

std::map<std::string, std::vector<std::string>> snapshot_names(SnapshotKind kind,
                                                               const std::vector<std::string>& theirs,
                                                               const std::string& path) {
  std::map<std::string, std::vector<std::string>> out;
  if (kind == SnapshotKind::timm) {
    for (const auto& name : theirs) out[name] = {name};
    return out;
  }
  std::vector<std::string> unknown;
  std::map<std::string, std::array<std::string, 3>> qkv;
  for (const auto& full : theirs) {
    // ViTForImageClassification nests the backbone under "vit."; a ViTModel saves it at the top.
    const std::string name = starts_with(full, "vit.") || starts_with(full, "classifier.") ? full : "vit." + full;
    std::string ours;
    for (const auto& [mine, hf] : hf_top_names()) {
      if (ours.empty()) ours = rename(name, hf, mine);
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
        if (auto out = rename(rest, hf, mine); !out.empty()) ours = block + out;
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
  if (!unknown.empty()) {
    std::string list;
    for (size_t i = 0; i < unknown.size() && i < 8; ++i) list += (i ? ", " : "") + unknown[i];
    if (unknown.size() > 8) list += ", ... (" + std::to_string(unknown.size()) + " in all)";
    fail(path, "tensors that a Hugging Face ViT does not have: " + list);
  }
  return out;
}

std::string timm_architecture(const ModelConfig& m) {
  // `create_model` needs a registered name, and model_args carry every other field, so the name matters only for
  // what model_args cannot say: the LayerNorm epsilon (norm_layer), and init_values None (create_model drops None). Among the names with the model's epsilon, the
  // model's own preset, else the nearest by family options, patch, width, depth and resolution (a label only).
  std::string best;
  int64_t best_gap = -1;
  for (const auto& arch : kTimmArchitectures) {
    const ModelConfig p = model_preset(arch.name);
    if (std::abs(p.layer_norm_eps - m.layer_norm_eps) > 1e-12 * m.layer_norm_eps) continue;
    // timm's create_model drops None arguments, so "no LayerScale" can only come from the name.
    if (!m.init_values && p.init_values) continue;
    if (arch.name == m.preset) return m.preset;
    const int64_t family = (p.class_token != m.class_token) + (p.reg_tokens != m.reg_tokens) +
                           (p.no_embed_class != m.no_embed_class) + (p.pre_norm != m.pre_norm) +
                           (p.global_pool != m.global_pool) + (p.act_layer != m.act_layer) +
                           (p.init_values.has_value() != m.init_values.has_value()) + (p.qk_norm != m.qk_norm) +
                           (p.final_norm != m.final_norm) + (p.use_fc_norm() != m.use_fc_norm());
    const int64_t gap = family * 100000000 + std::abs(p.patch_size - m.patch_size) * 1000000 +
                        std::abs(p.embed_dim - m.embed_dim) * 100 + std::abs(p.depth - m.depth) * 10 +
                        std::abs(p.img_h - m.img_h) + std::abs(p.img_w - m.img_w);
    if (best_gap < 0 || gap < best_gap) best = arch.name, best_gap = gap;
  }
  return best;
}

std::map<std::string, json> snapshot_files(SnapshotKind kind, const ModelConfig& m, const Preprocess& p,
                                           const std::vector<std::string>& class_names) {
  auto refuse = [&](const std::string& what) {
    throw std::invalid_argument(std::string(name_of(kind)) + " format cannot represent " + what);
  };
  if (m.rel_pos_bias) refuse("the relative position bias (model.rel_pos_bias)");
  json mean = p.mean, std_ = p.std;
  std::map<std::string, json> files;
  if (kind == SnapshotKind::timm) {
    const std::string arch = timm_architecture(m);
    if (arch.empty()) {
      refuse("layer_norm_eps " + num(m.layer_norm_eps) + " (timm's ViT architectures use 1e-6, CLIP's 1e-5)");
    }
    json args = {{"img_size", json::array({m.img_h, m.img_w})}, {"patch_size", m.patch_size},
                 {"in_chans", m.in_chans},   {"num_classes", m.num_classes},
                 {"embed_dim", m.embed_dim}, {"depth", m.depth},
                 {"num_heads", m.num_heads}, {"mlp_ratio", m.mlp_ratio},
                 {"qkv_bias", m.qkv_bias},   {"class_token", m.class_token},
                 {"global_pool", name_of(m.global_pool)},
                 {"reg_tokens", m.reg_tokens},
                 {"no_embed_class", m.no_embed_class},
                 {"pre_norm", m.pre_norm},
                 {"final_norm", m.final_norm},
                 {"fc_norm", m.use_fc_norm()},
                 {"qk_norm", m.qk_norm},
                 {"act_layer", name_of(m.act_layer)}};
    args["init_values"] = m.init_values ? json(*m.init_values) : json(nullptr);
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
  // Hugging Face's ViTForImageClassification: class token, token pooling, no LayerScale, square-free sizes.
  if (!m.class_token) refuse("a model without a class token (model.class_token false)");
  if (m.global_pool != GlobalPool::token) {
    refuse(std::string("global_pool \"") + name_of(m.global_pool) + "\" (HF's ViT reads the class token)");
  }
  if (m.init_values) refuse("LayerScale (model.init_values)");
  if (m.reg_tokens > 0) refuse("register tokens (model.reg_tokens)");
  if (m.no_embed_class) refuse("a position embedding without the class slot (model.no_embed_class)");
  if (m.pre_norm) refuse("pre_norm (CLIP's norm before the blocks)");
  if (m.qk_norm) refuse("qk_norm");
  if (!m.final_norm || m.use_fc_norm()) refuse("a final norm other than HF's layernorm on every token");
  if (m.act_layer != Activation::gelu) refuse(std::string("act_layer ") + name_of(m.act_layer) + " (vit writes exact GELU)");
  if (m.num_classes <= 0) refuse("a model without a classifier head (num_classes 0)");
  const double hidden = m.embed_dim * m.mlp_ratio;
  if (hidden != std::floor(hidden)) refuse("mlp_ratio " + num(m.mlp_ratio) + " (not a whole MLP width)");
  const bool crops = p.crop_pct != 1.0 || p.crop_mode != CropMode::squash;
  if (crops && p.crop_mode == CropMode::center && m.img_h != m.img_w) {
    refuse("crop_mode center at the rectangular size " + std::to_string(m.img_h) + "x" + std::to_string(m.img_w) +
           " (timm resizes until both sides cover it, keeping the ratio: no transformers processor resizes so)");
  }
  json id2label = json::object(), label2id = json::object();
  for (int64_t i = 0; i < m.num_classes; ++i) {
    const std::string name = i < static_cast<int64_t>(class_names.size()) ? class_names[i] : std::to_string(i);
    id2label[std::to_string(i)] = name;
    label2id[name] = i;
  }
  json image_size = m.img_h == m.img_w ? json(m.img_h) : json::array({m.img_h, m.img_w});
  files["config.json"] = {{"architectures", {"ViTForImageClassification"}},
                          {"model_type", "vit"},
                          {"hidden_size", m.embed_dim},
                          {"num_hidden_layers", m.depth},
                          {"num_attention_heads", m.num_heads},
                          {"intermediate_size", static_cast<int64_t>(hidden)},
                          {"hidden_act", "gelu"},
                          {"hidden_dropout_prob", 0.0},
                          {"attention_probs_dropout_prob", 0.0},
                          {"initializer_range", 0.02},
                          {"layer_norm_eps", m.layer_norm_eps},
                          {"image_size", image_size},
                          {"patch_size", m.patch_size},
                          {"num_channels", m.in_chans},
                          {"qkv_bias", m.qkv_bias},
                          {"encoder_stride", m.patch_size},
                          {"id2label", id2label},
                          {"label2id", label2id},
                          {"dtype", "float32"}};
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

}  // namespace vit
