// Model behaviour: presets, masks, position-embedding resampling, rectangular inputs, relative bias, LayerScale,
// head ablation, clear size errors, and model files that round-trip bit-identically.
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "config/config.h"
#include "config/validate.h"
#include "export/export.h"
#include "io/model_file.h"
#include "io/safetensors.h"
#include "model/flops.h"
#include "model/vit.h"
#include "test_util.h"
#include "util/fs.h"

namespace vit {
namespace {

ModelConfig tiny(int64_t img = 32, int64_t patch = 8) {
  return test::tiny_vit(img, patch, /*in_chans=*/3, /*num_classes=*/5, /*embed_dim=*/32, /*depth=*/2, /*num_heads=*/4,
                        /*mlp_ratio=*/2.0);
}

TEST(ModelPresets, ParameterCountsEqualTimm) {
  torch::NoGradGuard no_grad;
  const std::vector<std::pair<std::string, int64_t>> expected{{"vit_tiny_patch16_224", 5717416},
                                                              {"vit_small_patch16_224", 22050664},
                                                              {"vit_base_patch16_224", 86567656}};
  for (const auto& [name, count] : expected) {
    VisionTransformer net(model_preset(name));
    EXPECT_EQ(count_parameters(*net), count) << name;
  }
  // ViT-B/16 forward: timm reports 17.6 GMACs.
  EXPECT_NEAR(static_cast<double>(forward_macs(model_preset("vit_base_patch16_224"))) / 1e9, 17.57, 0.01);
}

// Training's forward with patch_drop_rate runs the blocks on the patch tokens it keeps: its MACs are the forward's on
// a grid of that many patches, plus the embedding of the patches left out (every patch is embedded first).
TEST(ModelPresets, TrainingMacsCountTheTokensPatchDropRateKeeps) {
  auto m = tiny();  // 32x32 at patch 8: 16 patches
  EXPECT_EQ(forward_macs(m, 0, 0, /*training=*/true), forward_macs(m));
  m.patch_drop_rate = 0.5;                           // 8 of the 16 kept
  EXPECT_EQ(forward_macs(m), forward_macs(tiny()));  // evaluation: every token
  const int64_t embed_per_patch = m.embed_dim * m.in_chans * m.patch_size * m.patch_size;
  EXPECT_EQ(forward_macs(m, 0, 0, /*training=*/true), forward_macs(m, 32, 16) + 8 * embed_per_patch);
}

TEST(ModelNames, StateDictKeysAreTimms) {
  auto config = tiny();
  config.init_values = 1e-5;
  VisionTransformer net(config);
  std::set<std::string> keys;
  for (const auto& p : net->named_parameters()) keys.insert(p.key());
  for (const char* key : {"cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias",
                          "blocks.0.norm1.weight", "blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias",
                          "blocks.0.attn.proj.weight", "blocks.0.ls1.gamma", "blocks.0.norm2.bias",
                          "blocks.1.mlp.fc1.weight", "blocks.1.mlp.fc2.bias", "blocks.1.ls2.gamma", "norm.weight",
                          "head.weight", "head.bias"}) {
    EXPECT_TRUE(keys.count(key)) << key;
  }
  config.global_pool = GlobalPool::avg;
  VisionTransformer pooled(config);
  std::set<std::string> pooled_keys;
  for (const auto& p : pooled->named_parameters()) pooled_keys.insert(p.key());
  EXPECT_TRUE(pooled_keys.count("fc_norm.weight"));
  EXPECT_FALSE(pooled_keys.count("norm.weight"));
}

TEST(ModelInit, FollowsTimmDefaults) {
  torch::manual_seed(0);
  VisionTransformer net(model_preset("vit_small_patch16_224"));
  auto qkv = net->blocks[0]->as<Block>()->attn->qkv;
  EXPECT_NEAR(qkv->weight.std().item<double>(), 0.02, 0.001);
  EXPECT_EQ(qkv->bias.abs().max().item<double>(), 0.0);
  EXPECT_NEAR(net->pos_embed.std().item<double>(), 0.02, 0.002);
  EXPECT_LT(net->cls_token.abs().max().item<double>(), 1e-4);
  EXPECT_EQ(net->norm->weight.min().item<double>(), 1.0);
}

TEST(ModelMasks, CausalMaskMakesTokenIndependentOfLaterTokens) {
  torch::manual_seed(1);
  torch::NoGradGuard no_grad;
  VisionTransformer net(tiny());
  net->eval();
  const int64_t N = 1 + 16;
  auto x = torch::randn({1, 3, 32, 32});
  auto changed = x.clone();
  changed.index_put_({0, torch::indexing::Slice(), torch::indexing::Slice(24, 32), torch::indexing::Slice(24, 32)},
                     torch::randn({3, 8, 8}));  // only the last patch (token 16) changes
  const auto mask = causal_mask(N);
  const auto a = net->forward_features(x, mask), b = net->forward_features(changed, mask);
  EXPECT_LT(test::max_abs_diff(a.narrow(1, 0, 16), b.narrow(1, 0, 16)), 1e-6);  // tokens 0..15 unaffected
  EXPECT_GT(test::max_abs_diff(a.select(1, 16), b.select(1, 16)), 1e-3);
  // Without the mask every token sees the change.
  EXPECT_GT(test::max_abs_diff(net->forward_features(x).select(1, 0), net->forward_features(changed).select(1, 0)),
            1e-4);
}

TEST(ModelMasks, KeyPaddingMaskZeroesAttentionToPaddedKeys) {
  torch::manual_seed(2);
  torch::NoGradGuard no_grad;
  VisionTransformer net(tiny());
  net->eval();
  auto keep = torch::ones({2, 17}, torch::kBool);
  keep.index_put_({0, torch::indexing::Slice(10)}, false);
  Capture capture;
  capture.attention = true;
  net->forward_features(torch::randn({2, 3, 32, 32}), key_padding_mask(keep), &capture);
  for (const auto& probs : capture.attention_probs) {
    EXPECT_EQ(probs[0].narrow(-1, 10, 7).abs().max().item<double>(), 0.0);
    EXPECT_GT(probs[1].narrow(-1, 10, 7).abs().max().item<double>(), 0.0);
    EXPECT_LT(test::max_abs_diff(probs.sum(-1), torch::ones({2, 4, 17})), 1e-5);
  }
}

TEST(ModelPosEmbed, ResampleToSameSizeIsIdentityAndOtherSizesWork) {
  torch::manual_seed(3);
  VisionTransformer net(tiny());
  EXPECT_TRUE(torch::equal(net->pos_embed_for(4, 4), net->pos_embed));
  const auto resampled = net->pos_embed_for(6, 8);
  EXPECT_EQ(resampled.sizes(), (std::vector<int64_t>{1, 1 + 48, 32}));
  EXPECT_TRUE(torch::equal(resampled.select(1, 0), net->pos_embed.select(1, 0)));  // class slot kept
  // A constant grid stays constant under bicubic resampling (a basic sanity check of the layout).
  auto constant = torch::ones({1, 17, 3});
  EXPECT_LT(test::max_abs_diff(resample_pos_embed(constant, 4, 4, 7, 5, 1), torch::ones({1, 36, 3})), 1e-5);
}

TEST(ModelInput, RectangularAndOtherSizes) {
  torch::manual_seed(4);
  torch::NoGradGuard no_grad;
  auto config = tiny();
  config.img_h = 32, config.img_w = 48;
  VisionTransformer net(config);
  net->eval();
  Capture capture;
  capture.attention = true;
  auto logits = net->forward_head(net->forward_features(torch::randn({2, 3, 32, 48}), {}, &capture));
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(capture.attention_probs[0].sizes(), (std::vector<int64_t>{2, 4, 25, 25}));
  EXPECT_EQ(net->forward(torch::randn({1, 3, 64, 24})).sizes(), (std::vector<int64_t>{1, 5}));  // resampled grid
}

TEST(ModelInput, BadSizesNameBothSizes) {
  VisionTransformer net(tiny());
  try {
    net->forward(torch::randn({1, 3, 30, 32}));
    FAIL() << "a 30x32 input was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "cannot forward 30x32: not divisible by patch 8 (model trained at 32x32)");
  }
  EXPECT_THROW(net->forward(torch::randn({1, 1, 32, 32})), std::invalid_argument);
}

TEST(ModelRelativeBias, ChangesAttentionAndTrains) {
  torch::manual_seed(5);
  auto config = tiny();
  config.rel_pos_bias = true;
  VisionTransformer net(config);
  auto attn = net->blocks[0]->as<Block>()->attn;
  ASSERT_TRUE(attn->relative_position_bias_table.defined());
  EXPECT_EQ(attn->relative_position_bias_table.sizes(), (std::vector<int64_t>{7 * 7 + 3, 4}));
  // Index: same offset -> same entry; the class token has its own entries.
  const auto index = relative_position_index(4, 4, 4, 4, 1);
  EXPECT_EQ(index[1][2].item<int64_t>(), index[5][6].item<int64_t>());  // both (0, -1)
  EXPECT_EQ(index[0][3].item<int64_t>(), 49);
  EXPECT_EQ(index[3][0].item<int64_t>(), 50);
  EXPECT_EQ(index[0][0].item<int64_t>(), 51);
  auto x = torch::randn({1, 3, 32, 32});
  Capture before, after;
  before.attention = after.attention = true;
  net->eval();
  net->forward_features(x, {}, &before);
  {
    torch::NoGradGuard no_grad;
    attn->relative_position_bias_table.normal_(0, 1);
  }
  net->forward_features(x, {}, &after);
  EXPECT_GT(test::max_abs_diff(before.attention_probs[0], after.attention_probs[0]), 1e-3);
  net->train();
  net->forward(x).sum().backward();
  EXPECT_GT(attn->relative_position_bias_table.grad().abs().sum().item<double>(), 0.0);
  EXPECT_EQ(net->forward(torch::randn({1, 3, 48, 40})).size(1), 5);  // other grids clip offsets
}

TEST(ModelHeadMask, ZeroesHeadOutputsAndRestores) {
  torch::manual_seed(6);
  torch::NoGradGuard no_grad;
  VisionTransformer net(tiny());
  net->eval();
  auto x = torch::randn({1, 3, 32, 32});
  const auto base = net->forward(x);
  net->set_head_mask(1, {0, 3});
  const auto masked = net->forward(x);
  EXPECT_GT(test::max_abs_diff(base, masked), 1e-5);
  // Masking all heads of a block equals removing its attention branch: zero projection input.
  net->set_head_mask(1, {});
  EXPECT_TRUE(torch::equal(net->forward(x), base));
  EXPECT_THROW(net->set_head_mask(2, {0}), std::invalid_argument);
  EXPECT_THROW(net->set_head_mask(0, {4}), std::invalid_argument);
}

TEST(ModelDropout, TrainModeIsStochasticEvalModeIsNot) {
  auto config = tiny();
  config.drop_path_rate = 0.5;
  config.attn_drop_rate = 0.2;
  VisionTransformer net(config);
  auto x = torch::randn({2, 3, 32, 32});
  net->train();
  EXPECT_GT(test::max_abs_diff(net->forward(x), net->forward(x)), 1e-6);
  net->eval();
  EXPECT_TRUE(torch::equal(net->forward(x), net->forward(x)));
}

// As timm's VisionTransformer: drop_rate is the head's dropout only, pos_drop_rate the tokens' after the position
// embedding (it was drop_rate's second use before pos_drop_rate existed).
TEST(ModelDropout, PosDropRateDropsTheTokensAndDropRateOnlyTheHead) {
  auto x = torch::randn({2, 3, 32, 32});
  auto features_vary = [&](const ModelConfig& config) {
    torch::manual_seed(4);
    VisionTransformer net(config);
    net->train();
    return test::max_abs_diff(net->forward_features(x), net->forward_features(x)) > 1e-6;
  };
  auto head_only = tiny();
  head_only.drop_rate = 0.5;
  EXPECT_FALSE(features_vary(head_only));
  auto tokens = tiny();
  tokens.pos_drop_rate = 0.5;
  EXPECT_TRUE(features_vary(tokens));
  VisionTransformer net(head_only);
  net->train();
  EXPECT_GT(test::max_abs_diff(net->forward(x), net->forward(x)), 1e-6);  // the head's dropout
}

// timm's PatchDropout: in training, each image keeps its prefix tokens (class token, register) and 12 of its 16
// patch tokens (rate 0.25), those that argsort(randn(B, 16)) puts first, as timm draws them; in evaluation, every
// token.
TEST(ModelDropout, PatchDropRateKeepsEachImagesPrefixAndTheFirstPatchesOfARandomOrder) {
  auto config = tiny();  // 32x32 at patch 8: 16 patches
  config.reg_tokens = 1;
  config.patch_drop_rate = 0.25;
  torch::manual_seed(5);
  VisionTransformer net(config);
  const auto x = torch::randn({4, 3, 32, 32});
  const int64_t prefix = config.num_prefix_tokens(), B = 4, D = config.embed_dim;
  Capture all, kept;
  net->eval();
  const auto full = net->forward_features(x, {}, &all);
  EXPECT_EQ(full.sizes(), (std::vector<int64_t>{B, prefix + 16, D}));
  net->train();
  torch::manual_seed(9);
  const auto tokens = net->forward_features(x, {}, &kept);
  torch::manual_seed(9);
  const auto order = torch::argsort(torch::randn({B, 16}), /*dim=*/int64_t{-1}).narrow(1, 0, 12);
  ASSERT_EQ(kept.embed.sizes(), (std::vector<int64_t>{B, prefix + 12, D}));
  EXPECT_EQ(tokens.sizes(), kept.embed.sizes());
  for (int64_t b = 0; b < B; ++b) {
    EXPECT_TRUE(torch::equal(kept.embed[b].narrow(0, 0, prefix), all.embed[b].narrow(0, 0, prefix))) << b;
    for (int64_t i = 0; i < 12; ++i) {
      const auto patch = order[b][i].item<int64_t>();
      EXPECT_TRUE(torch::equal(kept.embed[b][prefix + i], all.embed[b][prefix + patch])) << b << " " << i;
    }
  }
  EXPECT_FALSE(torch::equal(order[0], order[1]));  // each image its own draw
  net->forward_head(tokens).sum().backward();
  EXPECT_GT(net->patch_embed->proj->weight.grad().abs().sum().item<double>(), 0);
  net->eval();
  EXPECT_TRUE(torch::equal(net->forward_features(x), full));  // evaluation keeps every token

  config.rel_pos_bias = true;
  try {
    validate(config, "c.json");
    ADD_FAILURE() << "rel_pos_bias with patch_drop_rate accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("c.json: model.patch_drop_rate: cannot leave out patch tokens"),
              std::string::npos)
        << e.what();
  }
}

TEST(ModelFile, RoundTripIsBitIdenticalWithMetadata) {
  test::TempDir dir;
  torch::manual_seed(7);
  auto config = tiny();
  config.img_h = 32, config.img_w = 40;
  config.rel_pos_bias = true;
  VisionTransformer net(config);
  Preprocess preprocess;
  preprocess.mean = {0.1, 0.2, 0.3};
  preprocess.crop_pct = 0.875;
  const std::vector<std::string> names{"a", "b", "c", "d", "e"};
  save_model(dir.file("m.safetensors"), net, preprocess, names);
  auto loaded = load_model(dir.file("m.safetensors"));
  EXPECT_TRUE(loaded.has_metadata);
  EXPECT_EQ(to_json(loaded.config()), to_json(config));
  EXPECT_EQ(to_json(loaded.preprocess), to_json(preprocess));
  EXPECT_EQ(loaded.class_names, names);
  auto original = net->named_parameters();
  for (const auto& p : loaded.net->named_parameters()) EXPECT_TRUE(torch::equal(p.value(), original[p.key()])) << p.key();
  // The same bytes when written again: nothing drifts through a save/load cycle.
  save_model(dir.file("again.safetensors"), loaded.net, loaded.preprocess, loaded.class_names);
  const auto a = safetensors::read(dir.file("m.safetensors")), b = safetensors::read(dir.file("again.safetensors"));
  EXPECT_EQ(a.bytes, b.bytes);
  // timm layout: only timm names, float32.
  for (const auto& info : a.tensors) EXPECT_EQ(info.dtype, safetensors::DType::F32) << info.name;
}

TEST(ModelFile, FinetuneAdaptsHeadAndPositionEmbedding) {
  test::TempDir dir;
  torch::manual_seed(8);
  VisionTransformer source(tiny());
  save_model(dir.file("m.safetensors"), source, Preprocess{}, numbered_classes(5));
  auto target_config = tiny(48);
  target_config.num_classes = 3;
  VisionTransformer target(target_config);
  const auto notes = load_for_finetune(dir.file("m.safetensors"), target);
  EXPECT_EQ(notes.size(), 2u);
  EXPECT_TRUE(torch::equal(target->blocks[1]->as<Block>()->mlp->fc1->weight,
                           source->blocks[1]->as<Block>()->mlp->fc1->weight));
  EXPECT_EQ(target->pos_embed.size(1), 1 + 36);
  EXPECT_TRUE(torch::equal(target->pos_embed.select(1, 0), source->pos_embed.select(1, 0)));
}

// A `vit train` run folder as the model: its declared final.safetensors, else best.safetensors, said first in the
// log notes; a run folder with neither names the file to pass instead. Fine-tuning reads it the same way.
TEST(ModelFile, RunFolderLoadsItsFinalElseItsBestWeights) {
  test::TempDir dir;
  const std::string run = dir.file("run");
  torch::manual_seed(9);
  VisionTransformer final_net(tiny()), best_net(tiny());
  std::filesystem::create_directories(run);
  test::write_bytes(run + "/metrics.jsonl", "{}\n");
  test::write_bytes(run + "/config.json", "{\"train\": {}}");  // the run's training config, not a snapshot's
  const std::string no_weights = test::error_of([&] { load_model(run); });
  EXPECT_EQ(no_weights, run + ": a vit run folder with neither final.safetensors nor best.safetensors yet (the run "
                              "ended before its first evaluation); name one of its files, e.g. " + run +
                              "/last.safetensors");
  save_model(run + "/best.safetensors", best_net, Preprocess{}, numbered_classes(5));
  auto best = load_model(run);
  EXPECT_EQ(best.path, run + "/best.safetensors");
  ASSERT_FALSE(best.adapted.empty());
  EXPECT_NE(best.adapted.front().find("best.safetensors, the best on its validation split"), std::string::npos)
      << best.adapted.front();
  save_model(run + "/final.safetensors", final_net, Preprocess{}, numbered_classes(5));
  auto final_model = load_model(run);
  EXPECT_EQ(final_model.path, run + "/final.safetensors");
  EXPECT_NE(final_model.adapted.front().find("final.safetensors, the weights its train.final_weights declared"),
            std::string::npos) << final_model.adapted.front();
  EXPECT_EQ(final_model.sources.back(), (std::pair<std::string, std::string>{"run folder", run}));
  EXPECT_TRUE(torch::equal(final_model.net->head->weight, final_net->head->weight));
  EXPECT_FALSE(torch::equal(final_model.net->head->weight, best_net->head->weight));
  VisionTransformer tuned(tiny());
  const auto notes = load_for_finetune(run, tuned);
  ASSERT_FALSE(notes.empty());
  EXPECT_NE(notes.front().find("final.safetensors"), std::string::npos) << notes.front();
  EXPECT_TRUE(torch::equal(tuned->head->weight, final_net->head->weight));
  // A snapshot folder is still a snapshot: a model.safetensors beside a final.safetensors is not a run.
  test::write_bytes(run + "/model.safetensors", "not read as a run folder");
  EXPECT_EQ(test::error_of([&] { load_model(run); }).find("run folder"), std::string::npos);
}

// Sharded snapshot folders both ways: vit export --max-shard-size writes transformers' layout (an index and
// model-0000i-of-0000N.safetensors shards, none over the limit unless one tensor is), and a sharded timm or HF folder
// loads and fine-tunes as the single-file one does. An index that points outside the folder, or at a shard without
// the tensor, is refused naming it.
TEST(ModelFile, ShardedSnapshotsWriteAndLoadLikeOneFile) {
  test::TempDir dir;
  torch::manual_seed(10);
  LoadedModel model;
  model.net = VisionTransformer(tiny());
  model.class_names = numbered_classes(5);
  model.preprocess.crop_mode = CropMode::squash;  // what HF's ViTImageProcessor represents
  const uint64_t limit = 20000;
  for (const auto& [format, name] : std::vector<std::pair<ExportFormat, std::string>>{{ExportFormat::timm, "timm"},
                                                                                        {ExportFormat::hf, "hf"}}) {
    const std::string one = dir.file(name), sharded = dir.file(name + "_sharded");
    export_model(model, {format, one, false});
    ExportRequest request{format, sharded, false};
    request.max_shard_bytes = limit;
    export_model(model, request);
    EXPECT_FALSE(file_exists(sharded + "/model.safetensors"));
    const auto index = nlohmann::json::parse(read_file(sharded + "/model.safetensors.index.json"));
    std::map<std::string, int> tensors_per_shard;
    for (const auto& item : index["weight_map"].items()) ++tensors_per_shard[item.value().get<std::string>()];
    ASSERT_GE(tensors_per_shard.size(), 3u) << index.dump();
    for (const auto& [shard, count] : tensors_per_shard) {
      char suffix[32];
      std::snprintf(suffix, sizeof suffix, "-of-%05zu.safetensors", tensors_per_shard.size());
      EXPECT_EQ(shard.rfind("model-", 0), 0u) << shard;
      EXPECT_EQ(shard.substr(shard.size() - std::strlen(suffix)), suffix) << shard;
      const auto archive = safetensors::read(sharded + "/" + shard);
      uint64_t bytes = 0;
      for (const auto& info : archive.tensors) bytes += info.end - info.begin;
      EXPECT_TRUE(bytes <= limit || count == 1) << shard << ": " << bytes << " bytes in " << count << " tensors";
    }
    std::cout << name << ": " << tensors_per_shard.size() << " shards of at most " << limit << " bytes\n";
    auto a = load_model(one), b = load_model(sharded);
    EXPECT_EQ(to_json(b.config()), to_json(a.config()));
    auto expected = a.net->named_parameters();
    for (const auto& p : b.net->named_parameters()) EXPECT_TRUE(torch::equal(p.value(), expected[p.key()])) << p.key();
    VisionTransformer tuned(tiny());
    load_for_finetune(sharded, tuned);
    EXPECT_TRUE(torch::equal(tuned->head->weight, model.net->head->weight));
  }
  const std::string index_path = dir.file("timm_sharded/model.safetensors.index.json");
  auto index = nlohmann::json::parse(read_file(index_path));
  const std::string shard = index["weight_map"]["head.weight"].get<std::string>();
  auto outside = index;
  outside["weight_map"]["head.weight"] = "../" + shard;
  test::write_bytes(index_path, outside.dump());
  EXPECT_EQ(test::error_of([&] { load_model(dir.file("timm_sharded")); }),
            index_path + ": weight_map names \"../" + shard + "\" for \"head.weight\": not the name of a file in the folder");
  auto elsewhere = index;
  const std::string other = index["weight_map"]["cls_token"].get<std::string>();
  ASSERT_NE(other, shard);
  elsewhere["weight_map"]["head.weight"] = other;
  test::write_bytes(index_path, elsewhere.dump());
  EXPECT_EQ(test::error_of([&] { load_model(dir.file("timm_sharded")); }),
            index_path + ": its weight_map puts head.weight in " + dir.file("timm_sharded/" + other) +
                ", which does not hold it");
  // The size as transformers spells it, and a format that has no shards.
  EXPECT_EQ(parse_shard_size("5GB"), 5000000000ull);
  EXPECT_EQ(parse_shard_size("500MiB"), 500ull << 20);
  EXPECT_EQ(parse_shard_size("20000"), 20000ull);
  EXPECT_EQ(parse_shard_size("20000000000"), 20000000000ull);
  for (const char* bad : {"5XB", "GB", "0", "-1", "1.5GB", "", "999999999999999999GiB"}) {
    EXPECT_NE(test::error_of([&] { parse_shard_size(bad); }).find("is not a size"), std::string::npos) << bad;
  }
  ExportRequest file_request{ExportFormat::vit, dir.file("m.safetensors"), false};
  file_request.max_shard_bytes = limit;
  EXPECT_EQ(test::error_of([&] { export_model(model, file_request); }),
            "--max-shard-size applies to --format timm and hf (snapshot folders) only");
}

// A hostile file (tests/data/fuzz/fuzz_model_file/): a few kilobytes of tensors under metadata that describes
// embed_dim 8192 and depth 256 (200 billion parameters). Refused before the network is built, naming the sizes.
TEST(ModelFile, MetadataLargerThanTheFileIsRefusedBeforeBuilding) {
  const std::string path = test::data_path("fuzz/fuzz_model_file/huge_architecture.safetensors");
  const std::string message = test::error_of([&] { load_model(path); });
  EXPECT_EQ(message.rfind(path + ": its metadata describes a model of ", 0), 0u) << message;
  EXPECT_NE(message.find("embed_dim 8192, depth 256"), std::string::npos) << message;
  EXPECT_NE(message.find("but the file holds only"), std::string::npos) << message;
}

}  // namespace
}  // namespace vit
