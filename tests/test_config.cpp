// Config parsing: presets with overrides, --set, and errors that name the JSON path, the value and the expectation.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "config/config.h"

namespace vit {
namespace {
using nlohmann::json;

std::string error_of(const json& doc) {
  try {
    parse_config(doc, "cfg.json");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ConfigParse, PresetFillsDefaultsThatKeysOverride) {
  const auto c = parse_config(json::parse(R"({"model": {"preset": "vit_small_patch16_224", "depth": 6,
                                              "img_size": [64, 96]}})"),
                              "cfg.json");
  EXPECT_EQ(c.model.embed_dim, 384);
  EXPECT_EQ(c.model.num_heads, 6);
  EXPECT_EQ(c.model.depth, 6);
  EXPECT_EQ(c.model.img_h, 64);
  EXPECT_EQ(c.model.img_w, 96);
  EXPECT_EQ(c.model.layer_norm_eps, 1e-6);
}

TEST(ConfigParse, ErrorsNamePathValueAndExpectation) {
  EXPECT_EQ(error_of(json::parse(R"({"model": {"embed_dim": 192, "num_heads": 5}})")),
            "cfg.json: model.num_heads: 5 does not divide embed_dim 192");
  EXPECT_EQ(error_of(json::parse(R"({"model": {"depht": 6}})")), "cfg.json: model.depht: unknown key");
  EXPECT_EQ(error_of(json::parse(R"({"train": {"lr": "fast"}})")), "cfg.json: train.lr: \"fast\" is not a number");
  EXPECT_EQ(error_of(json::parse(R"({"train": {"epochs": 2.5}})")), "cfg.json: train.epochs: 2.5 is not an integer");
  EXPECT_EQ(error_of(json::parse(R"({"data": {"interpolation": "nearest"}})")),
            "cfg.json: data.interpolation: \"nearest\" is not one of: bilinear, bicubic");
  EXPECT_EQ(error_of(json::parse(R"({"data": {"augment": {"hflip": 1.5}}})")),
            "cfg.json: data.augment.hflip: 1.5 is out of range [0, 1]");
  EXPECT_EQ(error_of(json::parse(R"({"model": {"img_size": 30, "patch_size": 16}})")),
            "cfg.json: model.img_size: 30x30 is not divisible by patch_size 16");
  EXPECT_EQ(error_of(json::parse(R"({"model": {"preset": "vit_huge"}})")).rfind("cfg.json: model.preset: unknown", 0), 0u);
  EXPECT_EQ(error_of(json::parse(R"({"extra": 1})")), "cfg.json: extra: unknown key");
  EXPECT_EQ(error_of(json::parse(R"({"train": {"final_weights": "ema"}})")),
            "cfg.json: train.final_weights: \"ema\" needs train.ema_decay > 0");
  EXPECT_EQ(error_of(json::parse(R"({"model": {"in_chans": 1}, "data": {"mean": [0.5, 0.5], "std": [1, 1]}})")),
            "cfg.json: data.mean: 2 values for a model with in_chans 1");
}

// Upper bounds: a model file's metadata is parsed by this reader, and an absurd architecture must be refused here,
// before anything is sized by it (and before flops.h's counts could overflow).
TEST(ConfigParse, ArchitectureBeyondTheBoundsIsRefused) {
  EXPECT_EQ(error_of(json::parse(R"({"model": {"embed_dim": 1000000000, "num_heads": 1}})")),
            "cfg.json: model.embed_dim: 1000000000 is out of range [1, 32768]");
  EXPECT_EQ(error_of(json::parse(R"({"model": {"depth": 4096}})")),
            "cfg.json: model.depth: 4096 is out of range [1, 1024]");
  EXPECT_EQ(error_of(json::parse(R"({"model": {"depth": -3}})")), "cfg.json: model.depth: -3 is out of range [1, 1024]");
  EXPECT_EQ(error_of(json::parse(R"({"model": {"img_size": [224, 9223372036854775807]}})")),
            "cfg.json: model.img_size: 224x9223372036854775807 is out of range: each side in [1, 65536]");
  EXPECT_EQ(error_of(json::parse(R"({"model": {"img_size": 4096, "patch_size": 8}})")),
            "cfg.json: model.img_size: 4096x4096 with patch_size 8 makes 512x512 patches, more than 65536");
  EXPECT_EQ(error_of(json::parse(R"({"model": {"mlp_ratio": 1e300}})")),
            "cfg.json: model.mlp_ratio: 1e+300 is out of range (0, 16]");
  EXPECT_EQ(error_of(json::parse(R"({"model": {"num_classes": 100000000}})")),
            "cfg.json: model.num_classes: 100000000 is out of range [0, 1048576]");
  EXPECT_EQ(error_of(json::parse(R"({"model": {"in_chans": 0}})")), "cfg.json: model.in_chans: 0 is out of range [1, 1024]");
  EXPECT_EQ(error_of(json::parse(R"({"model": {"embed_dim": 64, "num_heads": 128}})")),
            "cfg.json: model.num_heads: 128 is out of range [1, 64]");
}

TEST(ConfigOverride, SetAssignsJsonOrStringValues) {
  json doc = json::parse(R"({"model": {"depth": 12}})");
  apply_override(doc, "model.depth=6");
  apply_override(doc, "model.img_size=[32,48]");
  apply_override(doc, "train.device=cpu");
  apply_override(doc, "data.augment.hflip=0.5");
  const auto c = parse_config(doc, "x");
  EXPECT_EQ(c.model.depth, 6);
  EXPECT_EQ(c.model.img_w, 48);
  EXPECT_EQ(c.train.device, "cpu");
  EXPECT_EQ(c.data.augment.hflip, 0.5);
  EXPECT_THROW(apply_override(doc, "model.depth"), std::invalid_argument);
  EXPECT_THROW(apply_override(doc, "model..depth=1"), std::invalid_argument);
}

// A bare-word value that is not UTF-8 used to be accepted, and writing the config back (a run's config.json) then
// threw nlohmann's "invalid UTF-8 byte" naming neither the key nor the --set. Refused at once, escaped.
TEST(ConfigOverride, NonUtf8IsRefusedAndControlBytesAreEscaped) {
  json doc = json::parse("{}");
  std::string message;
  try {
    apply_override(doc, "data.root=/data/\xff\x1b[2J");
  } catch (const std::invalid_argument& e) {
    message = e.what();
  }
  EXPECT_EQ(message, "--set data.root=/data/\\xff\\x1b[2J: not valid UTF-8");
  apply_override(doc, "model.depht\x07=3");
  EXPECT_EQ(error_of(doc), "cfg.json: model.depht\\x07: unknown key");
}

TEST(ConfigRoundTrip, ToJsonParsesBackToTheSameConfig) {
  auto c = parse_config(json::parse(R"({"model": {"preset": "vit_tiny_patch16_224", "init_values": 1e-5,
      "global_pool": "avg", "rel_pos_bias": true}, "data": {"format": "cifar10", "augment": {"mixup_alpha": 0.8}},
      "train": {"epochs": 3, "ema_decay": 0.999}})"),
                        "x");
  const json once = to_json(c);
  const json twice = to_json(parse_config(once, "y"));
  EXPECT_EQ(once, twice);
  EXPECT_EQ(once["model"]["init_values"], 1e-5);
}

// Every key, written here by hand with a value other than its default: to_json must give back exactly this
// document. A field that parsing or to_json forgot, or one added to the config without a line here, fails it.
const char* const kEveryKey = R"({
  "model": {"preset": "vit_small_patch16_224", "img_size": [64, 96], "patch_size": 8, "in_chans": 1,
            "num_classes": 7, "embed_dim": 96, "depth": 3, "num_heads": 4, "mlp_ratio": 3.0, "qkv_bias": false,
            "class_token": false, "reg_tokens": 2, "no_embed_class": true, "pre_norm": true,
            "global_pool": "avg", "final_norm": false, "fc_norm": false, "qk_norm": true,
            "act_layer": "quick_gelu", "drop_rate": 0.1, "pos_drop_rate": 0.15, "attn_drop_rate": 0.2,
            "proj_drop_rate": 0.3, "drop_path_rate": 0.4, "init_values": 0.001, "layer_norm_eps": 1e-5,
            "rel_pos_bias": true, "attn_pool_num_heads": 2, "attn_pool_mlp_ratio": 2.0, "model_class": "eva",
            "use_abs_pos_emb": false, "use_rot_pos_emb": true, "rope_type": "dinov3", "rope_temperature": 100.0,
            "rope_grid_offset": 1.0, "rope_grid_indexing": "xy", "rope_rotate_half": true, "ref_feat_shape": [8, 12],
            "attn_type": "rope", "qkv_fused": false, "swiglu_mlp": true, "swiglu_align_to": 8, "scale_mlp": true,
            "scale_attn_inner": true, "attn_only_layer_scale": true, "norm_layer": "rmsnorm",
            "embed_norm_layer": "layernorm", "proj_bias": false, "num_kv_heads": [2, 4, 1],
            "rope_shift_coords": 0.5, "rope_jitter_coords": 1.5, "rope_rescale_coords": 2.0},
  "data": {"mean": [0.25], "std": [0.75], "interpolation": "bilinear", "crop_pct": 0.875, "crop_mode": "squash", "crop_offset": "floor",
           "eval_hflip": true,
           "format": "csv", "root": "r", "train_dir": "td", "val_dir": "vd", "test_dir": "sd", "train_csv": "t.csv",
           "val_csv": "v.csv", "test_csv": "s.csv", "train_shards": "t-{0..3}.tar", "val_shards": "v.tar",
           "test_shards": "s.txt", "shuffle_buffer": 50, "label_field": "y", "val_fraction": 0.2, "train_subset": 100, "val_subset": 50,
           "classes": ["Bag", "7"], "train_per_class": 20,
           "num_workers": 3, "prefetch_batches": 7, "reduced_decode": false, "on_bad_image": "skip",
           "augment": {"random_resized_crop": true, "scale": [0.2, 0.9], "ratio": [0.5, 2.0], "pad_crop": 4,
                       "hflip": 0.5, "randaugment_ops": 2, "randaugment_magnitude": 7.0, "random_erasing": 0.25,
                       "mixup_alpha": 0.8, "cutmix_alpha": 1.0, "mix_prob": 0.6, "switch_prob": 0.3}},
  "train": {"epochs": 4, "batch_size": 16, "accum_steps": 2, "lr": 0.002, "min_lr": 0.0001, "warmup_lr": 0.00001,
            "warmup_steps": 10, "warmup_epochs": 1.5, "weight_decay": 0.1, "beta1": 0.8, "beta2": 0.99,
            "eps": 1e-7, "clip_grad": 2.0, "label_smoothing": 0.2, "ema_decay": 0.99, "final_weights": "ema",
            "layer_decay": 0.75,
            "freeze": ["patch_embed", "blocks.0"], "device": "cpu",
            "amp": "bf16", "threads": 2, "seed": 7, "log_interval": 5, "checkpoint_interval": 20,
            "eval_interval": 2, "max_steps": 30, "target_top1": 88.5, "dist_backend": "gloo",
            "dist_timeout_s": 60.0, "output_root": "out"}
})";

std::vector<std::string> leaf_keys(const json& j, const std::string& prefix = "") {
  std::vector<std::string> keys;
  for (const auto& [key, value] : j.items()) {
    if (value.is_object()) {
      for (auto& inner : leaf_keys(value, prefix + key + ".")) keys.push_back(inner);
    } else {
      keys.push_back(prefix + key);
    }
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

// Keys that validate refuses beside others of the document above, with non-default values in a model they fit:
// VisionTransformer's MLP form, patch dropping (no relative bias or rotary embeddings), Eva's post-norm blocks (no
// qk_norm, LayerScale or grouped-query attention).
const char* const kOtherClassKeys =
    R"({"model": {"mlp_layer": "swiglu_packed", "act_layer": "silu", "patch_drop_rate": 0.25}})";
const char* const kPostNormKeys = R"({"model": {"model_class": "eva", "use_post_norm": true}})";

TEST(ConfigRoundTrip, EveryKeyWithANonDefaultValueSurvivesToJson) {
  const Config default_config;
  const json defaults = to_json(default_config);
  std::set<std::string> covered;
  for (const char* document : {kEveryKey, kOtherClassKeys, kPostNormKeys}) {
    const json written = json::parse(document);
    const json back = to_json(parse_config(written, "every-key.json"));
    // Non-default: every value differs from the default config's (else a dropped field would go unnoticed), and
    // to_json gives it back.
    for (const auto& key : leaf_keys(written)) {
      const json::json_pointer pointer("/" + std::regex_replace(key, std::regex("\\."), "/"));
      EXPECT_EQ(back.at(pointer), written.at(pointer)) << key << ": to_json gave " << back.at(pointer);
      covered.insert(key);
      if (key == "model.preset") continue;  // no default to differ from
      EXPECT_NE(written.at(pointer), defaults.at(pointer)) << key << " has its default value in the test document";
    }
  }
  std::vector<std::string> listed = config_keys();
  std::sort(listed.begin(), listed.end());
  EXPECT_EQ(std::vector<std::string>(covered.begin(), covered.end()), listed)
      << "config_keys() and this test's documents list different keys";
}

// Every key is documented beside its field in the config headers (the field has a `// ...` comment).
TEST(ConfigKeys, EachIsDocumentedInTheConfigHeaders) {
  std::string headers;
  for (const char* name : {"config.h", "model_config.h"}) {
    std::ifstream file(std::string(VIT_TEST_DATA) + "/../../src/config/" + name);
    ASSERT_TRUE(file) << name;
    headers += std::string(std::istreambuf_iterator<char>(file), {});
  }
  const std::map<std::string, std::string> field_of{{"img_size", "img_h"}, {"ref_feat_shape", "ref_feat_h"}};
  for (const auto& key : config_keys()) {
    std::string field = key.substr(key.rfind('.') + 1);
    if (field_of.count(field)) field = field_of.at(field);
    const std::regex documented("[ ,(<>:A-Za-z0-9_]+ " + field + "( = [^;]*)?;[ ]*//[^\n]+");
    EXPECT_TRUE(std::regex_search(headers, documented)) << key << ": no documented field `" << field << "`";
  }
}

TEST(ConfigEnums, EveryClosedSetRejectsOtherSpellingsNamingTheChoices) {
  const std::vector<std::pair<const char*, const char*>> cases{
      {R"({"model": {"global_pool": "max"}})", "model.global_pool: \"max\" is not one of: token, avg, map"},
      {R"({"model": {"act_layer": "relu"}})",
       "model.act_layer: \"relu\" is not one of: gelu, quick_gelu, gelu_tanh, silu"},
      {R"({"data": {"format": "imagenet"}})",
       "data.format: \"imagenet\" is not one of: folder, csv, mnist, fashion_mnist, cifar10, cifar100, wds"},
      {R"({"data": {"on_bad_image": "ignore"}})", "data.on_bad_image: \"ignore\" is not one of: fail, skip"},
      {R"({"train": {"amp": "fp8"}})", "train.amp: \"fp8\" is not one of: off, bf16, fp16, auto"},
      {R"({"train": {"final_weights": "best"}})", "train.final_weights: \"best\" is not one of: model, ema"},
      {R"({"train": {"dist_backend": "mpi"}})", "train.dist_backend: \"mpi\" is not one of: auto, gloo, nccl"}};
  for (const auto& [doc, message] : cases) EXPECT_EQ(error_of(json::parse(doc)), std::string("cfg.json: ") + message);
  EXPECT_EQ(error_of(json::parse(R"({"train": {"amp": 1}})")), "cfg.json: train.amp: 1 is not a string");
  EXPECT_EQ(name_of(DistBackend::automatic), std::string("auto"));
  EXPECT_EQ(enum_from_name<AmpMode>("auto"), AmpMode::automatic);
  EXPECT_EQ(enum_from_name<Interpolation>("bicubic"), Interpolation::bicubic);
  EXPECT_FALSE(enum_from_name<Interpolation>("nearest").has_value());
}

}  // namespace
}  // namespace vit

namespace vit {
namespace {

TEST(ConfigShipped, EveryConfigInConfigsParses) {
  const std::string dir = std::string(VIT_TEST_DATA) + "/../../configs";
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    EXPECT_NO_THROW(load_config(entry.path().string())) << entry.path();
    ++count;
  }
  EXPECT_GE(count, 5);
}

}  // namespace
}  // namespace vit
