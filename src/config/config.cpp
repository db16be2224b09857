// JSON config parsing: every key is read through one checked reader that knows its JSON path, so an unknown key,
// a wrong type or a bad value fails with "<file>: <path>: <value> <what was expected>".
#include "config/config.h"

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "config/timm_architectures.h"
#include "config/validate.h"
#include "util/fields.h"
#include "util/fs.h"
#include "util/text.h"

namespace vit {
using nlohmann::json;

namespace {

// Keys and file names come from the user's files: control and non-UTF-8 bytes are escaped, so the error stays one
// printable line.
[[noreturn]] void fail(const std::string& source, const std::string& path, const std::string& what) {
  throw std::invalid_argument(printable(source + ": " + path + ": " + what));
}

std::string show(const json& value) { return value.dump(); }

// Reads one JSON object, remembering which keys were used so that the rest can be reported as unknown.
class Section {
 public:
  Section(const json& object, std::string path, std::string source)
      : object_(object), path_(std::move(path)), source_(std::move(source)) {
    if (!object_.is_object()) fail(source_, path_, show(object_) + " is not an object");
  }

  std::string path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  const std::string& source() const { return source_; }
  bool has(const std::string& key) const { return object_.contains(key); }

  const json* take(const std::string& key) {
    used_.insert(key);
    auto it = object_.find(key);
    return it == object_.end() ? nullptr : &*it;
  }

  void read(const std::string& key, int64_t& out) {
    if (const json* v = take(key)) {
      if (!v->is_number_integer()) fail(source_, path(key), show(*v) + " is not an integer");
      out = v->get<int64_t>();
    }
  }
  void read(const std::string& key, uint64_t& out) {
    if (const json* v = take(key)) {
      if (!v->is_number_integer() || (v->is_number_integer() && !v->is_number_unsigned() && v->get<int64_t>() < 0)) {
        fail(source_, path(key), show(*v) + " is not a non-negative integer");
      }
      out = v->get<uint64_t>();
    }
  }
  void read(const std::string& key, double& out) {
    if (const json* v = take(key)) {
      if (!v->is_number()) fail(source_, path(key), show(*v) + " is not a number");
      out = v->get<double>();
    }
  }
  // null clears the optional; otherwise the value must have the type `is` checks ("a number", ...).
  template <typename T>
  void read_optional(const std::string& key, std::optional<T>& out, bool (json::*is)() const noexcept,
                     const char* what) {
    if (const json* v = take(key)) {
      if (v->is_null()) {
        out.reset();
      } else if ((v->*is)()) {
        out = v->get<T>();
      } else {
        fail(source_, path(key), show(*v) + " is not " + what + " or null");
      }
    }
  }
  void read(const std::string& key, std::optional<double>& out) {
    read_optional(key, out, &json::is_number, "a number");
  }
  void read(const std::string& key, std::optional<int64_t>& out) {
    read_optional(key, out, &json::is_number_integer, "an integer");
  }
  void read(const std::string& key, std::optional<bool>& out) {
    read_optional(key, out, &json::is_boolean, "true, false");
  }
  void read(const std::string& key, bool& out) {
    if (const json* v = take(key)) {
      if (!v->is_boolean()) fail(source_, path(key), show(*v) + " is not true or false");
      out = v->get<bool>();
    }
  }
  void read(const std::string& key, std::string& out) {
    if (const json* v = take(key)) {
      if (!v->is_string()) fail(source_, path(key), show(*v) + " is not a string");
      out = v->get<std::string>();
    }
  }
  // Key/value heads per block: null (none given: empty), one integer (every block), or one per block.
  void read(const std::string& key, std::vector<int64_t>& out) {
    if (const json* v = take(key)) {
      const std::string what = show(*v) + " is not an integer, an array of integers or null";
      out.clear();
      if (v->is_number_integer()) {
        out.push_back(v->get<int64_t>());
      } else if (v->is_array()) {
        for (const auto& item : *v) {
          if (!item.is_number_integer()) fail(source_, path(key), what);
          out.push_back(item.get<int64_t>());
        }
      } else if (!v->is_null()) {
        fail(source_, path(key), what);
      }
    }
  }
  void read(const std::string& key, std::vector<double>& out) {
    if (const json* v = take(key)) {
      if (!v->is_array() || v->empty()) fail(source_, path(key), show(*v) + " is not a non-empty array of numbers");
      out.clear();
      for (const auto& item : *v) {
        if (!item.is_number()) fail(source_, path(key), show(*v) + " is not a non-empty array of numbers");
        out.push_back(item.get<double>());
      }
    }
  }
  // Strings; integers are taken as their decimal spelling (data.classes accepts indices).
  void read(const std::string& key, std::vector<std::string>& out) {
    if (const json* v = take(key)) {
      const std::string what = show(*v) + " is not an array of strings";
      if (!v->is_array()) fail(source_, path(key), what);
      out.clear();
      for (const auto& item : *v) {
        if (item.is_string()) {
          out.push_back(item.get<std::string>());
        } else if (item.is_number_integer()) {
          out.push_back(std::to_string(item.get<int64_t>()));
        } else {
          fail(source_, path(key), what);
        }
      }
    }
  }
  void read(const std::string& key, std::array<double, 2>& out) {
    if (const json* v = take(key)) {
      if (!v->is_array() || v->size() != 2 || !(*v)[0].is_number() || !(*v)[1].is_number()) {
        fail(source_, path(key), show(*v) + " is not a [low, high] pair of numbers");
      }
      out = {(*v)[0].get<double>(), (*v)[1].get<double>()};
    }
  }
  // A closed set: one of the enum's spellings.
  template <typename E, typename = std::enable_if_t<std::is_enum_v<E>>>
  void read(const std::string& key, E& out) {
    std::string text;
    read(key, text);
    if (!has(key)) return;
    const auto value = enum_from_name<E>(text);
    if (!value) fail(source_, path(key), "\"" + text + "\" is not one of: " + enum_choices<E>());
    out = *value;
  }
  // null clears the optional; otherwise one of the enum's names.
  template <typename E, typename = std::enable_if_t<std::is_enum_v<E>>>
  void read(const std::string& key, std::optional<E>& out) {
    const json* v = object_.contains(key) ? &object_.at(key) : nullptr;
    if (v != nullptr && v->is_null()) {
      take(key);
      out.reset();
    } else if (v != nullptr) {
      E value{};
      read(key, value);
      out = value;
    }
  }

  // The keys nothing took, in the object's order.
  std::vector<std::string> unused() const {
    std::vector<std::string> keys;
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (!used_.count(it.key())) keys.push_back(it.key());
    }
    return keys;
  }

  // Unknown keys are an error, never silently ignored.
  void finish() const {
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (!used_.count(it.key())) fail(source_, path(it.key()), "unknown key");
    }
  }

 private:
  const json& object_;
  std::string path_, source_;
  std::set<std::string> used_;
};

}  // namespace

namespace {
// timm's plain ViT sizes: (width, depth, heads); MLP ratio 4 throughout.
struct PlainSize {
  const char* name;
  int64_t embed_dim, depth, num_heads;
};
constexpr PlainSize kPlainSizes[] = {
    {"tiny", 192, 12, 3}, {"small", 384, 12, 6}, {"base", 768, 12, 12}, {"large", 1024, 24, 16}, {"huge", 1280, 32, 16}};
constexpr int64_t kPlainPatches[] = {8, 14, 16, 32};

// "224" -> 224; -1 unless all digits.
int64_t parse_count(const std::string& text) {
  if (text.empty() || text.size() > 5 || text.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(text);
}
}  // namespace

namespace {
ModelConfig timm_architecture_preset(const TimmArchitecture& arch);
}  // namespace

std::vector<std::string> preset_names() {
  std::set<std::string> names;
  for (const auto& arch : kTimmArchitectures) names.insert(arch.name);
  for (const auto& size : kPlainSizes) {
    for (int64_t patch : kPlainPatches) {
      for (int res : {224, 384}) {
        if (res % patch != 0) continue;
        names.insert(std::string("vit_") + size.name + "_patch" + std::to_string(patch) + "_" + std::to_string(res));
      }
    }
  }
  return {names.begin(), names.end()};
}

ModelConfig model_preset(const std::string& name) {
  // timm's registered architectures that we build (config/timm_architectures.h), then the plain-ViT rule
  // vit_{size}_patch{P}_{resolution}, which also names sizes timm does not register (vit_tiny_patch8_224).
  for (const auto& arch : kTimmArchitectures) {
    if (name == arch.name) return timm_architecture_preset(arch);
  }
  ModelConfig m;
  m.preset = name;
  const std::string prefix = "vit_";
  const auto patch_at = name.find("_patch");
  const auto res_at = patch_at == std::string::npos ? std::string::npos : name.find('_', patch_at + 6);
  bool known = false;
  if (name.rfind(prefix, 0) == 0 && res_at != std::string::npos) {
    const std::string size = name.substr(prefix.size(), patch_at - prefix.size());
    const int64_t patch = parse_count(name.substr(patch_at + 6, res_at - patch_at - 6));
    const int64_t res = parse_count(name.substr(res_at + 1));
    for (const auto& s : kPlainSizes) {
      if (size == s.name && patch > 0 && res > 0 && res % patch == 0) {
        m.embed_dim = s.embed_dim, m.depth = s.depth, m.num_heads = s.num_heads;
        m.patch_size = patch, m.img_h = m.img_w = res;
        known = true;
      }
    }
  }
  if (!known) {
    throw std::invalid_argument("unknown model preset \"" + name +
                                "\" (known: timm's ViT architecture names, e.g. vit_base_patch16_224, "
                                "deit3_small_patch16_224, vit_small_patch14_reg4_dinov2, vit_base_patch16_clip_224, "
                                "vit_base_patch16_siglip_224; `vit info --presets` lists them)");
  }
  return m;
}

namespace {

// ---- The one list of config keys. Each section's fields are visited in one function, and parsing, to_json and
// config_keys() are visitors over it: a field added or dropped here is added or dropped everywhere. ----

template <typename Model, typename Visitor>
void visit_model(Model& m, Visitor& v) {
  v.preset("preset", m.preset);
  v.size("img_size", m.img_h, m.img_w);
  VIT_VISIT_FIELDS(v, m, patch_size, in_chans, num_classes, embed_dim, depth, num_heads, mlp_ratio, qkv_bias,
                   class_token, reg_tokens, no_embed_class, pre_norm, global_pool, final_norm, fc_norm, qk_norm,
                   act_layer, drop_rate, pos_drop_rate, patch_drop_rate, attn_drop_rate, proj_drop_rate, drop_path_rate,
                   init_values, layer_norm_eps, rel_pos_bias, attn_pool_num_heads, attn_pool_mlp_ratio, model_class,
                   use_abs_pos_emb, use_rot_pos_emb, rope_type, rope_temperature, rope_grid_offset, rope_grid_indexing,
                   rope_rotate_half);
  v.size("ref_feat_shape", m.ref_feat_h, m.ref_feat_w);
  VIT_VISIT_FIELDS(v, m, attn_type, qkv_fused, swiglu_mlp, swiglu_align_to, scale_mlp, scale_attn_inner,
                   attn_only_layer_scale, use_post_norm, rope_shift_coords, rope_jitter_coords, rope_rescale_coords,
                   num_kv_heads, norm_layer, embed_norm_layer, proj_bias, mlp_layer);
}

template <typename P, typename Visitor>
void visit_preprocess(P& p, Visitor& v) {
  VIT_VISIT_FIELDS(v, p, mean, std, interpolation, crop_pct, crop_mode, crop_offset, eval_hflip);
}

template <typename A, typename Visitor>
void visit_augment(A& a, Visitor& v) {
  VIT_VISIT_FIELDS(v, a,
                   random_resized_crop, scale, ratio, pad_crop, hflip, randaugment_ops, randaugment_magnitude,
                   random_erasing, mixup_alpha, cutmix_alpha, mix_prob, switch_prob);
}

template <typename D, typename Visitor>
void visit_data(D& d, Visitor& v) {
  visit_preprocess(d.preprocess, v);  // mean/std/.../crop_offset/eval_hflip sit directly under "data"
  VIT_VISIT_FIELDS(v, d,
                   format, root, train_dir, val_dir, test_dir, train_csv, val_csv, test_csv, train_shards, val_shards,
                   test_shards, shuffle_buffer, label_field, val_fraction, train_subset, val_subset, classes,
                   train_per_class, num_workers, prefetch_batches, reduced_decode, on_bad_image);
  v.section("augment", d.augment, [](auto& a, auto& sub) { visit_augment(a, sub); });
}

template <typename T, typename Visitor>
void visit_train(T& t, Visitor& v) {
  VIT_VISIT_FIELDS(v, t,
                   epochs, batch_size, accum_steps, lr, min_lr, warmup_lr, warmup_steps, warmup_epochs, weight_decay,
                   beta1, beta2, eps, clip_grad, label_smoothing, ema_decay, final_weights, layer_decay, freeze, device,
                   amp, threads, seed, log_interval, checkpoint_interval, eval_interval, max_steps, target_top1, dist_backend,
                   dist_timeout_s, output_root);
}

// Parsing: every key through Section's checked readers.
struct Reader {
  Section& s;
  template <typename Field>
  void operator()(const char* key, Field& field) {
    s.read(key, field);
  }
  void preset(const char*, std::string&) {}  // read before everything else (it fills the defaults)
  void size(const char* key, int64_t& h, int64_t& w) {
    const json* size = s.take(key);
    if (size == nullptr) return;
    if (size->is_null()) {  // timm's "none" (ref_feat_shape); img_size's validation refuses the 0
      h = w = 0;
    } else if (size->is_number_integer()) {
      h = w = size->get<int64_t>();
    } else if (size->is_array() && size->size() == 2 && (*size)[0].is_number_integer() &&
               (*size)[1].is_number_integer()) {
      h = (*size)[0].get<int64_t>();
      w = (*size)[1].get<int64_t>();
    } else {
      fail(s.source(), s.path(key), show(*size) + " is not an integer or an [H, W] pair");
    }
  }
  template <typename Sub, typename Visit>
  void section(const char* key, Sub& sub, Visit visit) {
    const json* object = s.take(key);
    if (object == nullptr) return;
    Section inner(*object, s.path(key), s.source());
    Reader reader{inner};
    visit(sub, reader);
    inner.finish();
  }
};

// Another format's model fields: Reader over the keys `spelling` gives (a field it spells "" is not read).
struct SpelledReader {
  Section& s;
  const FieldSpelling& spelling;
  template <typename Field>
  void operator()(const char* field, Field& value) {
    if (const std::string key = spelling(field); !key.empty()) s.read(key, value);
  }
  void preset(const char* field, std::string& name) { (*this)(field, name); }
  void size(const char* field, int64_t& h, int64_t& w) {
    if (const std::string key = spelling(field); !key.empty()) Reader{s}.size(key.c_str(), h, w);
  }
};

// A timm architecture's model section, read by the same reader as a config's (its spelling is ours).
ModelConfig timm_architecture_preset(const TimmArchitecture& arch) {
  ModelConfig m;
  const std::string source = std::string("timm architecture ") + arch.name;
  const json section = json::parse(arch.model);
  Section s(section, "model", source);
  Reader reader{s};
  visit_model(m, reader);
  s.finish();
  m.preset = arch.name;
  return m;
}

// to_json: enums as their spelling, an absent optional as null.
struct Writer {
  json& j;
  template <typename Field>
  void operator()(const char* key, const Field& field) {
    if constexpr (std::is_enum_v<Field>) {
      j[key] = name_of(field);
    } else {
      j[key] = field;
    }
  }
  void operator()(const char* key, const std::vector<int64_t>& field) {
    j[key] = field.empty() ? json(nullptr) : field.size() == 1 ? json(field[0]) : json(field);
  }
  template <typename T>
  void operator()(const char* key, const std::optional<T>& field) {
    if constexpr (std::is_enum_v<T>) {
      j[key] = field ? json(name_of(*field)) : json(nullptr);
    } else {
      j[key] = field ? json(*field) : json(nullptr);
    }
  }
  void preset(const char* key, const std::string& name) {
    if (!name.empty()) j[key] = name;
  }
  void size(const char* key, int64_t h, int64_t w) { j[key] = h == w ? json(h) : json::array({h, w}); }
  template <typename Sub, typename Visit>
  void section(const char* key, const Sub& sub, Visit visit) {
    json inner = json::object();
    Writer writer{inner};
    visit(sub, writer);
    j[key] = inner;
  }
};

// config_keys(): every key's dotted path.
struct KeyLister {
  std::string prefix;
  std::vector<std::string>& keys;
  template <typename Field>
  void operator()(const char* key, const Field&) {
    keys.push_back(prefix + key);
  }
  void preset(const char* key, const std::string&) { keys.push_back(prefix + key); }
  void size(const char* key, int64_t, int64_t) { keys.push_back(prefix + key); }
  template <typename Sub, typename Visit>
  void section(const char* key, const Sub& sub, Visit visit) {
    KeyLister inner{prefix + key + ".", keys};
    visit(sub, inner);
  }
};

// Parses one section with its visitor; the caller validates.
template <typename Struct, typename Visit>
void read_section(const json& object, const std::string& path, const std::string& source, Struct& out,
                  Visit visit) {
  Section s(object, path, source);
  Reader reader{s};
  visit(out, reader);
  s.finish();
}

}  // namespace

ModelConfig parse_model_config(const json& section_json, const std::string& source) {
  ModelConfig m;
  if (section_json.is_object() && section_json.contains("preset")) {
    const json& preset = section_json["preset"];
    if (!preset.is_string()) fail(source, VIT_MODEL_KEY(preset), show(preset) + " is not a string");
    try {
      m = model_preset(preset.get<std::string>());
    } catch (const std::invalid_argument& e) {
      fail(source, VIT_MODEL_KEY(preset), e.what());
    }
  }
  Section s(section_json, "model", source);
  s.take("preset");
  Reader reader{s};
  visit_model(m, reader);
  s.finish();
  validate(m, source);
  return m;
}

Preprocess parse_preprocess(const json& section_json, const std::string& source) {
  Preprocess p;
  read_section(section_json, "preprocess", source, p, [](auto& x, auto& v) { visit_preprocess(x, v); });
  validate_preprocess(p, source, "preprocess");
  return p;
}

Config parse_config(const json& doc, const std::string& source) {
  if (!doc.is_object()) fail(source, "(top level)", "a config must be a JSON object with model/data/train sections");
  Section top(doc, "", source);
  Config config;
  if (const json* model = top.take("model")) config.model = parse_model_config(*model, source);
  if (const json* data = top.take("data")) {
    read_section(*data, "data", source, config.data, [](auto& x, auto& v) { visit_data(x, v); });
    validate_data(config.data, source);
  }
  if (const json* train = top.take("train")) {
    read_section(*train, "train", source, config.train, [](auto& x, auto& v) { visit_train(x, v); });
    validate_train(config.train, source);
  }
  top.take("$comment");  // free-form note for humans
  top.finish();
  validate_channels(config, source);
  return config;
}

void apply_override(json& doc, const std::string& assignment) {
  // Keys and bare-word values become JSON strings, which must be UTF-8: a run writes its config back as JSON.
  try {
    json(assignment).dump();
  } catch (const json::type_error&) {
    throw std::invalid_argument("--set " + printable(assignment) + ": not valid UTF-8");
  }
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw std::invalid_argument("--set " + printable(assignment) + ": expected key.path=value");
  }
  const std::string key = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) value = text;  // a bare word is a string
  json* node = &doc;
  size_t start = 0;
  while (true) {
    const auto dot = key.find('.', start);
    const std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (part.empty()) throw std::invalid_argument("--set " + printable(assignment) + ": empty key component");
    if (!node->is_object()) {
      throw std::invalid_argument("--set " + printable(assignment) + ": " + printable(key) + " is not inside an object");
    }
    if (dot == std::string::npos) {
      (*node)[part] = value;
      return;
    }
    node = &(*node)[part];
    if (node->is_null()) *node = json::object();
    start = dot + 1;
  }
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  const std::string text = read_file(path);
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (doc.is_discarded()) {
    // Re-parse with exceptions only to get nlohmann's position information.
    try {
      doc = json::parse(text, nullptr, true, true);
    } catch (const json::parse_error& e) {
      throw std::invalid_argument(printable(path + ": not valid JSON: " + e.what()));
    }
  }
  for (const auto& o : overrides) apply_override(doc, o);
  return parse_config(doc, overrides.empty() ? path : path + " (with --set)");
}

json to_json(const ModelConfig& m) {
  json j = json::object();
  Writer writer{j};
  visit_model(m, writer);
  return j;
}

std::vector<std::string> read_model_fields(const json& object, const std::string& path, const std::string& source,
                                           const FieldSpelling& spelling, ModelConfig& m) {
  Section s(object, path, source);
  SpelledReader reader{s, spelling};
  visit_model(m, reader);
  return s.unused();
}

json write_model_fields(const ModelConfig& m, const FieldSpelling& spelling) {
  const json all = to_json(m);  // named: items() refers into it
  json out = json::object();
  for (const auto& [field, value] : all.items()) {
    if (const std::string key = spelling(field); !key.empty()) out[key] = value;
  }
  return out;
}

json to_json(const Preprocess& p) {
  json j = json::object();
  Writer writer{j};
  visit_preprocess(p, writer);
  return j;
}

json to_json(const Config& c) {
  json data = json::object(), train = json::object();
  Writer data_writer{data}, train_writer{train};
  visit_data(c.data, data_writer);
  visit_train(c.train, train_writer);
  return json{{"model", to_json(c.model)}, {"data", data}, {"train", train}};
}

int64_t ModelConfig::mlp_hidden() const {
  int64_t hidden = static_cast<int64_t>(static_cast<double>(embed_dim) * mlp_ratio);
  if (swiglu_split() && swiglu_align_to > 0) hidden += (swiglu_align_to - hidden % swiglu_align_to) % swiglu_align_to;
  // timm's SwiGLUPacked in VisionTransformer: fc1 has int(D * mlp_ratio) rows, half of them the gates.
  if (mlp_layer == MlpLayer::swiglu_packed) hidden /= 2;
  return hidden;
}

int64_t ModelConfig::pool_hidden() const {
  return static_cast<int64_t>(static_cast<double>(embed_dim) * attn_pool_mlp_ratio.value_or(mlp_ratio));
}

std::vector<std::string> numbered_classes(int64_t count) {
  std::vector<std::string> names;
  for (int64_t i = 0; i < count; ++i) names.push_back(std::to_string(i));
  return names;
}

std::vector<std::string> config_keys() {
  const Config c;
  std::vector<std::string> keys;
  KeyLister model{"model.", keys}, data{"data.", keys}, train{"train.", keys};
  visit_model(c.model, model);
  visit_data(c.data, data);
  visit_train(c.train, train);
  return keys;
}

int64_t eval_scale(int64_t size, double crop_pct) {
  return static_cast<int64_t>(std::floor(static_cast<double>(size) / crop_pct + 1e-9));
}

}  // namespace vit
