// JSON config parsing: every key is read through one checked reader that knows its JSON path, so an unknown key,
// a wrong type or a bad value fails with "<file>: <path>: <value> <what was expected>".
#include "config/config.h"

#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "util/fs.h"

namespace vit {
using nlohmann::json;

namespace {

[[noreturn]] void fail(const std::string& source, const std::string& path, const std::string& what) {
  throw std::invalid_argument(source + ": " + path + ": " + what);
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
  void read(const std::string& key, std::optional<double>& out) {
    if (const json* v = take(key)) {
      if (v->is_null()) {
        out.reset();
      } else if (v->is_number()) {
        out = v->get<double>();
      } else {
        fail(source_, path(key), show(*v) + " is not a number or null");
      }
    }
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
  void read(const std::string& key, std::array<double, 2>& out) {
    if (const json* v = take(key)) {
      if (!v->is_array() || v->size() != 2 || !(*v)[0].is_number() || !(*v)[1].is_number()) {
        fail(source_, path(key), show(*v) + " is not a [low, high] pair of numbers");
      }
      out = {(*v)[0].get<double>(), (*v)[1].get<double>()};
    }
  }
  // A string that must be one of `allowed`.
  void read_choice(const std::string& key, std::string& out, const std::vector<std::string>& allowed) {
    read(key, out);
    if (has(key)) check_choice(key, out, allowed);
  }
  void check_choice(const std::string& key, const std::string& value, const std::vector<std::string>& allowed) const {
    if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) return;
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
    fail(source_, path(key), "\"" + value + "\" is not one of: " + list);
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

json resolve_sections(const json& doc, const std::string& source) {
  if (!doc.is_object()) fail(source, "(top level)", "a config must be a JSON object with model/data/train sections");
  return doc;
}

}  // namespace

std::vector<std::string> preset_names() {
  return {"vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224", "vit_large_patch16_224"};
}

ModelConfig model_preset(const std::string& name) {
  ModelConfig m;
  m.preset = name;
  if (name == "vit_tiny_patch16_224") {
    m.embed_dim = 192, m.depth = 12, m.num_heads = 3;
  } else if (name == "vit_small_patch16_224") {
    m.embed_dim = 384, m.depth = 12, m.num_heads = 6;
  } else if (name == "vit_base_patch16_224") {
    m.embed_dim = 768, m.depth = 12, m.num_heads = 12;
  } else if (name == "vit_large_patch16_224") {
    m.embed_dim = 1024, m.depth = 24, m.num_heads = 16;
  } else {
    std::string list;
    for (const auto& p : preset_names()) list += (list.empty() ? "" : ", ") + p;
    throw std::invalid_argument("unknown model preset \"" + name + "\" (known: " + list + ")");
  }
  return m;
}

void validate(const ModelConfig& m, const std::string& source) {
  auto path = [](const char* key) { return std::string("model.") + key; };
  check(m.patch_size > 0, source, path("patch_size"), std::to_string(m.patch_size) + " must be positive");
  check(m.img_h > 0 && m.img_w > 0, source, path("img_size"),
        std::to_string(m.img_h) + "x" + std::to_string(m.img_w) + " must be positive");
  check(m.img_h % m.patch_size == 0 && m.img_w % m.patch_size == 0, source, path("img_size"),
        std::to_string(m.img_h) + "x" + std::to_string(m.img_w) + " is not divisible by patch_size " +
            std::to_string(m.patch_size));
  check(m.in_chans >= 1, source, path("in_chans"), std::to_string(m.in_chans) + " must be at least 1");
  check(m.num_classes >= 0, source, path("num_classes"), std::to_string(m.num_classes) + " must be >= 0");
  check(m.embed_dim >= 1, source, path("embed_dim"), std::to_string(m.embed_dim) + " must be positive");
  check(m.depth >= 1, source, path("depth"), std::to_string(m.depth) + " must be at least 1");
  check(m.num_heads >= 1, source, path("num_heads"), std::to_string(m.num_heads) + " must be at least 1");
  check(m.embed_dim % m.num_heads == 0, source, path("num_heads"),
        std::to_string(m.num_heads) + " does not divide embed_dim " + std::to_string(m.embed_dim));
  check(m.mlp_ratio > 0, source, path("mlp_ratio"), num(m.mlp_ratio) + " must be positive");
  check(m.global_pool == "token" || m.global_pool == "avg", source, path("global_pool"),
        "\"" + m.global_pool + "\" is not one of: token, avg");
  check(m.global_pool != "token" || m.class_token, source, path("global_pool"),
        "\"token\" pooling needs class_token true (use \"avg\")");
  check_range(m.drop_rate, 0, 1, true, source, path("drop_rate"));
  check_range(m.attn_drop_rate, 0, 1, true, source, path("attn_drop_rate"));
  check_range(m.proj_drop_rate, 0, 1, true, source, path("proj_drop_rate"));
  check_range(m.drop_path_rate, 0, 1, true, source, path("drop_path_rate"));
  check(m.layer_norm_eps > 0, source, path("layer_norm_eps"), num(m.layer_norm_eps) + " must be positive");
  check(!m.init_values || *m.init_values > 0, source, path("init_values"),
        num(m.init_values.value_or(0)) + " must be positive (or null for no LayerScale)");
}

ModelConfig parse_model_config(const json& section_json, const std::string& source) {
  Section s(section_json, "model", source);
  ModelConfig m;
  if (const json* preset = s.take("preset")) {
    if (!preset->is_string()) fail(source, "model.preset", show(*preset) + " is not a string");
    try {
      m = model_preset(preset->get<std::string>());
    } catch (const std::invalid_argument& e) {
      fail(source, "model.preset", e.what());
    }
  }
  if (const json* size = s.take("img_size")) {
    if (size->is_number_integer()) {
      m.img_h = m.img_w = size->get<int64_t>();
    } else if (size->is_array() && size->size() == 2 && (*size)[0].is_number_integer() &&
               (*size)[1].is_number_integer()) {
      m.img_h = (*size)[0].get<int64_t>();
      m.img_w = (*size)[1].get<int64_t>();
    } else {
      fail(source, "model.img_size", show(*size) + " is not an integer or an [H, W] pair");
    }
  }
  s.read("patch_size", m.patch_size);
  s.read("in_chans", m.in_chans);
  s.read("num_classes", m.num_classes);
  s.read("embed_dim", m.embed_dim);
  s.read("depth", m.depth);
  s.read("num_heads", m.num_heads);
  s.read("mlp_ratio", m.mlp_ratio);
  s.read("qkv_bias", m.qkv_bias);
  s.read("class_token", m.class_token);
  s.read_choice("global_pool", m.global_pool, {"token", "avg"});
  s.read("drop_rate", m.drop_rate);
  s.read("attn_drop_rate", m.attn_drop_rate);
  s.read("proj_drop_rate", m.proj_drop_rate);
  s.read("drop_path_rate", m.drop_path_rate);
  s.read("init_values", m.init_values);
  s.read("layer_norm_eps", m.layer_norm_eps);
  s.read("rel_pos_bias", m.rel_pos_bias);
  s.finish();
  validate(m, source);
  return m;
}

namespace {

void read_preprocess(Section& s, Preprocess& p) {
  s.read("mean", p.mean);
  s.read("std", p.std);
  s.read_choice("interpolation", p.interpolation, {"bilinear", "bicubic"});
  s.read("crop_pct", p.crop_pct);
  const auto& source = s.source();
  check(p.crop_pct > 0 && p.crop_pct <= 1, source, s.path("crop_pct"), num(p.crop_pct) + " is out of range (0, 1]");
  check(p.mean.size() == p.std.size(), source, s.path("std"),
        std::to_string(p.std.size()) + " values, but mean has " + std::to_string(p.mean.size()));
  for (double v : p.std) check(v > 0, source, s.path("std"), num(v) + " must be positive");
}

AugmentConfig parse_augment(const json& section_json, const std::string& source) {
  Section s(section_json, "data.augment", source);
  AugmentConfig a;
  s.read("random_resized_crop", a.random_resized_crop);
  s.read("scale", a.scale);
  s.read("ratio", a.ratio);
  s.read("pad_crop", a.pad_crop);
  s.read("hflip", a.hflip);
  s.read("randaugment_ops", a.randaugment_ops);
  s.read("randaugment_magnitude", a.randaugment_magnitude);
  s.read("random_erasing", a.random_erasing);
  s.read("mixup_alpha", a.mixup_alpha);
  s.read("cutmix_alpha", a.cutmix_alpha);
  s.read("mix_prob", a.mix_prob);
  s.read("switch_prob", a.switch_prob);
  s.finish();
  check(a.scale[0] > 0 && a.scale[0] <= a.scale[1] && a.scale[1] <= 1, source, "data.augment.scale",
        interval(a.scale) + " must satisfy 0 < low <= high <= 1");
  check(a.ratio[0] > 0 && a.ratio[0] <= a.ratio[1], source, "data.augment.ratio",
        interval(a.ratio) + " must satisfy 0 < low <= high");
  check(a.pad_crop >= 0, source, "data.augment.pad_crop", std::to_string(a.pad_crop) + " must be >= 0");
  check_range(a.hflip, 0, 1, false, source, "data.augment.hflip");
  check(a.randaugment_ops >= 0, source, "data.augment.randaugment_ops",
        std::to_string(a.randaugment_ops) + " must be >= 0");
  check_range(a.randaugment_magnitude, 0, 30, false, source, "data.augment.randaugment_magnitude");
  check_range(a.random_erasing, 0, 1, false, source, "data.augment.random_erasing");
  check(a.mixup_alpha >= 0, source, "data.augment.mixup_alpha", num(a.mixup_alpha) + " must be >= 0");
  check(a.cutmix_alpha >= 0, source, "data.augment.cutmix_alpha", num(a.cutmix_alpha) + " must be >= 0");
  check_range(a.mix_prob, 0, 1, false, source, "data.augment.mix_prob");
  check_range(a.switch_prob, 0, 1, false, source, "data.augment.switch_prob");
  return a;
}

DataConfig parse_data(const json& section_json, const std::string& source) {
  Section s(section_json, "data", source);
  DataConfig d;
  read_preprocess(s, d.preprocess);
  s.read_choice("format", d.format, {"folder", "csv", "mnist", "fashion_mnist", "cifar10", "cifar100"});
  s.read("root", d.root);
  s.read("train_dir", d.train_dir);
  s.read("val_dir", d.val_dir);
  s.read("test_dir", d.test_dir);
  s.read("train_csv", d.train_csv);
  s.read("val_csv", d.val_csv);
  s.read("test_csv", d.test_csv);
  s.read("val_fraction", d.val_fraction);
  s.read("train_subset", d.train_subset);
  s.read("val_subset", d.val_subset);
  s.read("num_workers", d.num_workers);
  s.read("prefetch_batches", d.prefetch_batches);
  s.read_choice("on_bad_image", d.on_bad_image, {"fail", "skip"});
  if (const json* augment = s.take("augment")) d.augment = parse_augment(*augment, source);
  s.finish();
  check_range(d.val_fraction, 0, 1, true, source, "data.val_fraction");
  check(d.train_subset >= 0, source, "data.train_subset", std::to_string(d.train_subset) + " must be >= 0");
  check(d.val_subset >= 0, source, "data.val_subset", std::to_string(d.val_subset) + " must be >= 0");
  check(d.num_workers >= 0, source, "data.num_workers", std::to_string(d.num_workers) + " must be >= 0");
  check(d.prefetch_batches >= 1, source, "data.prefetch_batches",
        std::to_string(d.prefetch_batches) + " must be >= 1");
  return d;
}

TrainConfig parse_train(const json& section_json, const std::string& source) {
  Section s(section_json, "train", source);
  TrainConfig t;
  s.read("epochs", t.epochs);
  s.read("batch_size", t.batch_size);
  s.read("accum_steps", t.accum_steps);
  s.read("lr", t.lr);
  s.read("min_lr", t.min_lr);
  s.read("warmup_lr", t.warmup_lr);
  s.read("warmup_steps", t.warmup_steps);
  s.read("warmup_epochs", t.warmup_epochs);
  s.read("weight_decay", t.weight_decay);
  s.read("beta1", t.beta1);
  s.read("beta2", t.beta2);
  s.read("eps", t.eps);
  s.read("clip_grad", t.clip_grad);
  s.read("label_smoothing", t.label_smoothing);
  s.read("ema_decay", t.ema_decay);
  s.read("device", t.device);
  s.read_choice("amp", t.amp, {"off", "bf16", "fp16"});
  s.read("threads", t.threads);
  s.read("seed", t.seed);
  s.read("log_interval", t.log_interval);
  s.read("checkpoint_interval", t.checkpoint_interval);
  s.read("eval_interval", t.eval_interval);
  s.read("max_steps", t.max_steps);
  s.read_choice("dist_backend", t.dist_backend, {"auto", "gloo", "nccl"});
  s.read("dist_timeout_s", t.dist_timeout_s);
  s.read("output_root", t.output_root);
  s.finish();
  auto positive = [&](int64_t v, const char* key) {
    check(v >= 1, source, std::string("train.") + key, std::to_string(v) + " must be at least 1");
  };
  auto non_negative = [&](int64_t v, const char* key) {
    check(v >= 0, source, std::string("train.") + key, std::to_string(v) + " must be >= 0");
  };
  positive(t.epochs, "epochs");
  positive(t.batch_size, "batch_size");
  positive(t.accum_steps, "accum_steps");
  positive(t.log_interval, "log_interval");
  positive(t.eval_interval, "eval_interval");
  non_negative(t.warmup_steps, "warmup_steps");
  non_negative(t.threads, "threads");
  non_negative(t.checkpoint_interval, "checkpoint_interval");
  non_negative(t.max_steps, "max_steps");
  check(t.lr > 0, source, "train.lr", num(t.lr) + " must be positive");
  check(t.min_lr >= 0 && t.min_lr <= t.lr, source, "train.min_lr", num(t.min_lr) + " must be in [0, lr]");
  check(t.warmup_lr >= 0, source, "train.warmup_lr", num(t.warmup_lr) + " must be >= 0");
  check(t.warmup_epochs >= 0, source, "train.warmup_epochs", num(t.warmup_epochs) + " must be >= 0");
  check(t.weight_decay >= 0, source, "train.weight_decay", num(t.weight_decay) + " must be >= 0");
  check_range(t.beta1, 0, 1, true, source, "train.beta1");
  check_range(t.beta2, 0, 1, true, source, "train.beta2");
  check(t.eps > 0, source, "train.eps", num(t.eps) + " must be positive");
  check(t.clip_grad >= 0, source, "train.clip_grad", num(t.clip_grad) + " must be >= 0 (0 = off)");
  check_range(t.label_smoothing, 0, 1, true, source, "train.label_smoothing");
  check_range(t.ema_decay, 0, 1, true, source, "train.ema_decay");
  check(t.device == "auto" || t.device == "cpu" || t.device.rfind("cuda", 0) == 0, source, "train.device",
        "\"" + t.device + "\" is not one of: auto, cpu, cuda, cuda:N");
  check(t.dist_timeout_s > 0, source, "train.dist_timeout_s", num(t.dist_timeout_s) + " must be positive");
  return t;
}

}  // namespace

Preprocess parse_preprocess(const json& section_json, const std::string& source) {
  Section s(section_json, "preprocess", source);
  Preprocess p;
  read_preprocess(s, p);
  s.finish();
  return p;
}

Config parse_config(const json& doc_in, const std::string& source) {
  const json doc = resolve_sections(doc_in, source);
  Section top(doc, "", source);
  Config config;
  if (const json* model = top.take("model")) config.model = parse_model_config(*model, source);
  if (const json* data = top.take("data")) config.data = parse_data(*data, source);
  if (const json* train = top.take("train")) config.train = parse_train(*train, source);
  top.take("$comment");  // free-form note for humans
  top.finish();
  const auto channels = static_cast<size_t>(config.model.in_chans);
  const auto& p = config.data.preprocess;
  check(p.mean.size() == 1 || p.mean.size() == channels, source, "data.mean",
        std::to_string(p.mean.size()) + " values for a model with in_chans " + std::to_string(channels));
  return config;
}

void apply_override(json& doc, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw std::invalid_argument("--set " + assignment + ": expected key.path=value");
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
    if (part.empty()) throw std::invalid_argument("--set " + assignment + ": empty key component");
    if (!node->is_object()) throw std::invalid_argument("--set " + assignment + ": " + key + " is not inside an object");
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
      throw std::invalid_argument(path + ": not valid JSON: " + e.what());
    }
  }
  for (const auto& o : overrides) apply_override(doc, o);
  return parse_config(doc, overrides.empty() ? path : path + " (with --set)");
}

json to_json(const ModelConfig& m) {
  json j;
  if (!m.preset.empty()) j["preset"] = m.preset;
  j["img_size"] = m.img_h == m.img_w ? json(m.img_h) : json::array({m.img_h, m.img_w});
  j["patch_size"] = m.patch_size;
  j["in_chans"] = m.in_chans;
  j["num_classes"] = m.num_classes;
  j["embed_dim"] = m.embed_dim;
  j["depth"] = m.depth;
  j["num_heads"] = m.num_heads;
  j["mlp_ratio"] = m.mlp_ratio;
  j["qkv_bias"] = m.qkv_bias;
  j["class_token"] = m.class_token;
  j["global_pool"] = m.global_pool;
  j["drop_rate"] = m.drop_rate;
  j["attn_drop_rate"] = m.attn_drop_rate;
  j["proj_drop_rate"] = m.proj_drop_rate;
  j["drop_path_rate"] = m.drop_path_rate;
  j["init_values"] = m.init_values ? json(*m.init_values) : json(nullptr);
  j["layer_norm_eps"] = m.layer_norm_eps;
  j["rel_pos_bias"] = m.rel_pos_bias;
  return j;
}

json to_json(const Preprocess& p) {
  return json{{"mean", p.mean}, {"std", p.std}, {"interpolation", p.interpolation}, {"crop_pct", p.crop_pct}};
}

json to_json(const Config& c) {
  const auto& a = c.data.augment;
  json augment{{"random_resized_crop", a.random_resized_crop},
               {"scale", a.scale},
               {"ratio", a.ratio},
               {"pad_crop", a.pad_crop},
               {"hflip", a.hflip},
               {"randaugment_ops", a.randaugment_ops},
               {"randaugment_magnitude", a.randaugment_magnitude},
               {"random_erasing", a.random_erasing},
               {"mixup_alpha", a.mixup_alpha},
               {"cutmix_alpha", a.cutmix_alpha},
               {"mix_prob", a.mix_prob},
               {"switch_prob", a.switch_prob}};
  const auto& d = c.data;
  json data = to_json(d.preprocess);
  data.update(json{{"format", d.format},
                   {"root", d.root},
                   {"train_dir", d.train_dir},
                   {"val_dir", d.val_dir},
                   {"test_dir", d.test_dir},
                   {"train_csv", d.train_csv},
                   {"val_csv", d.val_csv},
                   {"test_csv", d.test_csv},
                   {"val_fraction", d.val_fraction},
                   {"train_subset", d.train_subset},
                   {"val_subset", d.val_subset},
                   {"num_workers", d.num_workers},
                   {"prefetch_batches", d.prefetch_batches},
                   {"on_bad_image", d.on_bad_image},
                   {"augment", augment}});
  const auto& t = c.train;
  json train{{"epochs", t.epochs},
             {"batch_size", t.batch_size},
             {"accum_steps", t.accum_steps},
             {"lr", t.lr},
             {"min_lr", t.min_lr},
             {"warmup_lr", t.warmup_lr},
             {"warmup_steps", t.warmup_steps},
             {"warmup_epochs", t.warmup_epochs},
             {"weight_decay", t.weight_decay},
             {"beta1", t.beta1},
             {"beta2", t.beta2},
             {"eps", t.eps},
             {"clip_grad", t.clip_grad},
             {"label_smoothing", t.label_smoothing},
             {"ema_decay", t.ema_decay},
             {"device", t.device},
             {"amp", t.amp},
             {"threads", t.threads},
             {"seed", t.seed},
             {"log_interval", t.log_interval},
             {"checkpoint_interval", t.checkpoint_interval},
             {"eval_interval", t.eval_interval},
             {"max_steps", t.max_steps},
             {"dist_backend", t.dist_backend},
             {"dist_timeout_s", t.dist_timeout_s},
             {"output_root", t.output_root}};
  return json{{"model", to_json(c.model)}, {"data", data}, {"train", train}};
}

}  // namespace vit
