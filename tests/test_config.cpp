// Config parsing: presets with overrides, --set, and errors that name the JSON path, the value and the expectation.
#include <gtest/gtest.h>

#include <filesystem>

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
  EXPECT_EQ(error_of(json::parse(R"({"model": {"in_chans": 1}, "data": {"mean": [0.5, 0.5], "std": [1, 1]}})")),
            "cfg.json: data.mean: 2 values for a model with in_chans 1");
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
