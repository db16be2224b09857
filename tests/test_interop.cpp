// Models in and out (io/snapshot.h, export/export.h), against the real libraries: timm and transformers build
// random-initialised models and save them as they publish snapshots; we load those with no config and predict
// within 1e-4 of the library on an image that needs resizing; our exports load back in timm (strict) and
// transformers with the same logits at batch 1 and 3 and the same preprocessing (ViTImageProcessor's PIL backend
// exactly; its torchvision backend, transformers 5's default, within one 8-bit level). References come from
// tests/reference_models.py, run by the project's reference Python (skips with the reason where it is missing).
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "export/export.h"
#include "image/decode.h"
#include "image/draw.h"
#include "io/model_file.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "io/snapshot.h"
#include "test_util.h"
#include "util/fs.h"

namespace vit {
namespace {

using test::error_of;
using test::max_abs_diff;
using test::run_python;
using test::TempDir;

constexpr double kLogitTolerance = 1e-4;

torch::Tensor our_logits(LoadedModel& model, const std::string& image, torch::Tensor* pixels = nullptr) {
  torch::NoGradGuard no_grad;
  const auto& m = model.config();
  const auto x = preprocess(decode_image(image), model.preprocess, m.img_h, m.img_w, m.in_chans).unsqueeze(0);
  if (pixels) *pixels = x;
  return model.net->forward(x);
}

// ViTImageProcessor's torchvision backend (transformers 5's default) resizes in float: at most one 8-bit level away.
void expect_within_one_level(const torch::Tensor& ours, const torch::Tensor& torchvision, const Preprocess& p) {
  double level = 0;
  for (double s : p.std) level = std::max(level, 1.0 / 255.0 / s);
  const double diff = max_abs_diff(ours, torchvision);
  std::cout << "  vs the torchvision backend: max |d| pixels " << diff << " (one level: " << level << ")\n";
  EXPECT_LE(diff, level + 1e-5);
}

std::string source_of(const LoadedModel& model, const std::string& part) {
  for (const auto& [name, from] : model.sources) {
    if (name == part) return from;
  }
  return "(none)";
}

struct TimmCase {
  std::string name, arch, args, dtype;
};

void PrintTo(const TimmCase& c, std::ostream* os) { *os << c.name << " (" << c.arch << ")"; }

class TimmSnapshot : public ::testing::TestWithParam<TimmCase> {};

TEST_P(TimmSnapshot, PredictsLikeTimmWithNoConfig) {
  SKIP_WITHOUT_PYTHON("timm", "safetensors");
  const auto& c = GetParam();
  TempDir dir;
  const std::string snap = dir / "snapshot", image = dir / "image.png", ref = dir / "ref.safetensors";
  run_python("reference_models.py", "timm-snapshot " + test::quoted(snap) + " --arch " + c.arch + " --args " +
                                        test::quoted(c.args) + " --labels '[\"ant\", \"bee\", \"cat\", \"dog\", \"eel\"]'" +
                                        " --dtype " + c.dtype + " --image " + test::quoted(image) + " --ref " + test::quoted(ref));
  auto model = load_model(snap);
  const auto expected = safetensors::read(ref);
  torch::Tensor pixels;
  const auto logits = our_logits(model, image, &pixels);
  const double pixel_diff = max_abs_diff(pixels, expected.tensor("pixels"));
  const double logit_diff = max_abs_diff(logits, expected.tensor("logits"));
  std::cout << c.name << ": max |d| pixels " << pixel_diff << ", logits " << logit_diff << "\n";
  EXPECT_LE(pixel_diff, 1e-5) << "preprocessing differs from timm's";
  EXPECT_LE(logit_diff, kLogitTolerance);
  EXPECT_EQ(model.class_names, (std::vector<std::string>{"ant", "bee", "cat", "dog", "eel"}));
  EXPECT_EQ(source_of(model, "preprocess"), "config.json: pretrained_cfg");
  // save_for_hf keeps the pretrained tag in pretrained_cfg.tag, not in the architecture.
  const std::string arch = c.arch.substr(0, c.arch.find('.'));
  EXPECT_NE(source_of(model, "model").find("timm architecture " + arch), std::string::npos) << source_of(model, "model");
}

INSTANTIATE_TEST_SUITE_P(
    Architectures, TimmSnapshot,
    ::testing::Values(
        // timm's own pretrained tag in the name; centre crop at crop_pct 0.9, bicubic.
        TimmCase{"small_token", "vit_small_patch16_224.augreg_in21k_ft_in1k",
                 R"({"depth": 2, "embed_dim": 64, "num_heads": 2, "img_size": 32, "num_classes": 5})", "f32"},
        // Patch 8, a rectangle, average pooling without a class token, LayerScale, half-precision weights.
        TimmCase{"base8_avg_f16", "vit_base_patch8_224",
                 R"({"depth": 2, "embed_dim": 48, "num_heads": 3, "img_size": [24, 40], "num_classes": 5,
                     "global_pool": "avg", "class_token": false, "init_values": 0.1, "qkv_bias": false})",
                 "f16"},
        // Patch 14 (timm's huge), bfloat16.
        TimmCase{"huge14_bf16", "vit_huge_patch14_224",
                 R"({"depth": 1, "embed_dim": 32, "num_heads": 2, "img_size": 28, "num_classes": 5,
                     "mlp_ratio": 2.0})",
                 "bf16"}),
    [](const auto& info) { return info.param.name; });

class HfSnapshot : public ::testing::TestWithParam<std::string> {};

TEST_P(HfSnapshot, PredictsLikeTransformersWithNoConfig) {
  SKIP_WITHOUT_PYTHON("transformers", "safetensors");
  {
    // "f32", "bf16", or "f32_sharded": saved by save_pretrained in shards with their index.
    const std::string dtype = GetParam().substr(0, GetParam().find('_'));
    const bool sharded = GetParam().find("_sharded") != std::string::npos;
    TempDir dir;
    const std::string snap = dir / "snapshot", image = dir / "image.png", ref = dir / "ref.safetensors";
    run_python("reference_models.py",
               "hf-snapshot " + test::quoted(snap) +
                   " --config '{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                   "\"intermediate_size\": 128, \"image_size\": 32, \"patch_size\": 8, \"layer_norm_eps\": 1e-12, "
                   "\"id2label\": {\"0\": \"cat\", \"1\": \"dog\", \"2\": \"eel\"}, "
                   "\"label2id\": {\"cat\": 0, \"dog\": 1, \"eel\": 2}}'"
                   " --processor '{\"size\": {\"height\": 32, \"width\": 32}, \"image_mean\": [0.4, 0.5, 0.6], "
                   "\"image_std\": [0.2, 0.25, 0.3]}' --dtype " +
                   dtype + (sharded ? " --max-shard-size 100KB" : "") + " --image " + test::quoted(image) + " --ref " +
                   test::quoted(ref));
    EXPECT_EQ(file_exists(snap + "/model.safetensors.index.json"), sharded);
    EXPECT_EQ(file_exists(snap + "/model.safetensors"), !sharded);
    auto model = load_model(snap);
    const auto expected = safetensors::read(ref);
    torch::Tensor pixels;
    const auto logits = our_logits(model, image, &pixels);
    const double pixel_diff = max_abs_diff(pixels, expected.tensor("pixels"));
    const double logit_diff = max_abs_diff(logits, expected.tensor("logits"));
    std::cout << "hf " << GetParam() << ": max |d| pixels " << pixel_diff << ", logits " << logit_diff << "\n";
    EXPECT_LE(pixel_diff, 1e-5) << "preprocessing differs from ViTImageProcessor's";
    expect_within_one_level(pixels, expected.tensor("pixels_torchvision"), model.preprocess);
    EXPECT_LE(logit_diff, kLogitTolerance);
    EXPECT_EQ(model.class_names, (std::vector<std::string>{"cat", "dog", "eel"}));
    EXPECT_EQ(model.config().layer_norm_eps, 1e-12);
    EXPECT_EQ(source_of(model, "preprocess"), "preprocessor_config.json: ViTImageProcessor");

    // Fine-tuning from the folder: the backbone is copied, the head re-initialised for another class count.
    ModelConfig other = model.config();
    other.num_classes = 7;
    VisionTransformer net(other);
    const auto notes = load_for_finetune(snap, net);
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_NE(notes[0].find("head re-initialised"), std::string::npos);
    EXPECT_TRUE(torch::equal(net->blocks[1]->as<Block>()->attn->qkv->weight,
                             model.net->blocks[1]->as<Block>()->attn->qkv->weight));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, HfSnapshot, ::testing::Values("f32", "bf16", "f32_sharded"),
                         [](const auto& info) { return info.param; });

// A small model of ours, random but with every tensor away from its init, saved as our own file.
LoadedModel our_model(ModelConfig config, const Preprocess& preprocess, const std::string& path) {
  torch::manual_seed(3);
  VisionTransformer net(config);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : net->parameters()) p.add_(torch::randn_like(p) * 0.05);
  }
  std::vector<std::string> names;
  for (int64_t i = 0; i < config.num_classes; ++i) names.push_back("class " + std::to_string(i));
  save_model(path, net, preprocess, names);
  return load_model(path);
}

// Inputs x.1 (batch 1) and x.3 (batch 3) for the checks, and our logits for them.
std::map<std::string, torch::Tensor> write_inputs(LoadedModel& model, const std::string& path) {
  const auto& m = model.config();
  torch::manual_seed(4);
  std::map<std::string, torch::Tensor> ours;
  safetensors::NamedTensors inputs;
  for (int64_t batch : {1, 3}) {
    const auto x = torch::randn({batch, m.in_chans, m.img_h, m.img_w});
    inputs.emplace_back("x." + std::to_string(batch), x);
    torch::NoGradGuard no_grad;
    ours["logits." + std::to_string(batch)] = model.net->forward(x);
  }
  safetensors::write(path, inputs, {});
  return ours;
}

void expect_same_logits(const std::map<std::string, torch::Tensor>& ours, const safetensors::Archive& theirs,
                        const std::string& what) {
  for (const auto& [name, logits] : ours) {
    const double diff = max_abs_diff(logits, theirs.tensor(name));
    std::cout << what << " " << name << ": max |d| " << diff << "\n";
    EXPECT_LE(diff, kLogitTolerance) << what << " " << name;
  }
}

// Token pooling; average pooling without a class token on a rectangle, with LayerScale; AIMv2's RmsNorm, patch
// embedding norm, bias-free SwiGLU and SiLU (the architecture name carries the norms and MLP); timm's Eva class twice:
// an EVA-02 (rotary cat over a reference grid, q_bias / v_bias, packed SwiGLU, average pooling with fc_norm) and a
// RoPE-ViT mixed with what it does not have (q_proj / k_proj / v_proj, split SwiGLU with mlp.norm, attn.norm, gamma_1
// only, a MAP head with its own heads, no final norm).
ModelConfig export_timm_config(const std::string& name) {
  if (name == "token") return test::tiny_vit(32, 8, 3, 4, 48, 2, 3, 2.0);
  ModelConfig m = test::tiny_vit(24, 8, 3, 4, 32, 2, 2, 4.0);
  m.img_w = 40, m.init_values = 0.1;
  if (name == "avg") {
    m.global_pool = GlobalPool::avg, m.class_token = false;
  } else if (name == "aimv2") {
    m.norm_layer = NormLayer::rmsnorm, m.embed_norm_layer = NormLayer::rmsnorm, m.layer_norm_eps = 1e-5;
    m.mlp_layer = MlpLayer::swiglu, m.act_layer = Activation::silu, m.proj_bias = false, m.qkv_bias = false;
    m.global_pool = GlobalPool::avg, m.class_token = false, m.fc_norm = false;
  } else if (name == "eva02") {
    m.model_class = ModelClass::eva, m.use_rot_pos_emb = true, m.ref_feat_h = 4, m.ref_feat_w = 4;
    m.swiglu_mlp = true, m.mlp_ratio = 8.0 / 3.0, m.global_pool = GlobalPool::avg;
  } else {
    m.model_class = ModelClass::eva, m.use_abs_pos_emb = false, m.use_rot_pos_emb = true;
    m.rope_type = RopeType::mixed, m.rope_grid_indexing = GridIndexing::xy, m.rope_temperature = 10.0;
    m.attn_type = AttnType::rope, m.qkv_fused = false, m.swiglu_mlp = true, m.scale_mlp = true;
    m.scale_attn_inner = true, m.attn_only_layer_scale = true, m.reg_tokens = 1, m.global_pool = GlobalPool::map;
    m.attn_pool_num_heads = 4, m.final_norm = false;
  }
  return m;
}

class ExportTimm : public ::testing::TestWithParam<std::string> {};

TEST_P(ExportTimm, LoadsInTimmStrictWithTheSameLogitsAndPreprocessing) {
  SKIP_WITHOUT_PYTHON("timm", "safetensors");
  TempDir dir;
  Preprocess p;
  p.crop_pct = 0.875, p.mean = {0.45, 0.5, 0.55}, p.std = {0.2, 0.3, 0.4};
  {
    const std::string tag = GetParam();
    const ModelConfig config = export_timm_config(GetParam());
    auto model = our_model(config, p, dir / ("m" + tag + ".safetensors"));
    const std::string out = dir / ("timm" + tag), image = dir / ("image" + tag + ".png");
    export_model(model, {ExportFormat::timm, out, false});
    // An image written by the reference script: a timm snapshot of anything makes one.
    run_python("reference_models.py", "timm-snapshot " + test::quoted(dir / ("scratch" + tag)) +
                                          " --arch vit_tiny_patch16_224 --args '{\"depth\": 1, \"img_size\": 32}'" +
                                          " --image " + test::quoted(image) + " --ref " + test::quoted(dir / "scratch.ref"));
    const auto ours = write_inputs(model, dir / "inputs.safetensors");
    const std::string labels =
        run_python("reference_models.py", "check-timm " + test::quoted(out) + " --inputs " +
                                              test::quoted(dir / "inputs.safetensors") + " --image " + test::quoted(image) +
                                              " --ref " + test::quoted(dir / "check.safetensors"));
    const auto theirs = safetensors::read(dir / "check.safetensors");
    expect_same_logits(ours, theirs, "timm export " + tag);
    torch::Tensor pixels;
    our_logits(model, image, &pixels);
    EXPECT_LE(max_abs_diff(pixels, theirs.tensor("pixels")), 1e-5) << "timm reads another preprocessing";
    EXPECT_NE(labels.find("class 3"), std::string::npos) << labels;
    // And back: the snapshot loads here as the model it came from.
    auto again = load_model(out);
    EXPECT_EQ(to_json(again.config()), to_json(model.config()));
    EXPECT_EQ(again.class_names, model.class_names);
  }
}

INSTANTIATE_TEST_SUITE_P(Pools, ExportTimm, ::testing::Values("token", "avg", "aimv2", "eva02", "eva_rope_mixed"),
                         [](const auto& info) { return info.param; });

TEST(ExportHf, LoadsInTransformersWithTheSameLogitsAndPreprocessing) {
  SKIP_WITHOUT_PYTHON("transformers", "safetensors");
  TempDir dir;
  Preprocess p;
  p.crop_pct = 1.0, p.crop_mode = CropMode::squash, p.interpolation = Interpolation::bilinear;
  ModelConfig config = test::tiny_vit(32, 8, 3, 5, 48, 2, 3, 2.0);
  config.layer_norm_eps = 1e-12;
  auto model = our_model(config, p, dir / "m.safetensors");
  const std::string out = dir / "hf", image = dir / "image.png";
  export_model(model, {ExportFormat::hf, out, false});
  run_python("reference_models.py", "timm-snapshot " + test::quoted(dir / "scratch") +
                                        " --arch vit_tiny_patch16_224 --args '{\"depth\": 1, \"img_size\": 32}'" +
                                        " --image " + test::quoted(image) + " --ref " + test::quoted(dir / "scratch.ref"));
  const auto ours = write_inputs(model, dir / "inputs.safetensors");
  const std::string labels =
      run_python("reference_models.py", "check-hf " + test::quoted(out) + " --inputs " + test::quoted(dir / "inputs.safetensors") +
                                            " --image " + test::quoted(image) + " --ref " + test::quoted(dir / "check.safetensors"));
  // The same model in shards (--max-shard-size), as transformers' from_pretrained reads them. Asked before any
  // answer is read, so that the reference run hears every question in its first round.
  const std::string sharded = dir / "hf_sharded";
  ExportRequest request{ExportFormat::hf, sharded, false};
  request.max_shard_bytes = 40000;
  export_model(model, request);
  const auto index = nlohmann::json::parse(read_file(sharded + "/model.safetensors.index.json"));
  std::set<std::string> shards;
  for (const auto& item : index["weight_map"].items()) shards.insert(item.value().get<std::string>());
  EXPECT_GE(shards.size(), 3u);
  run_python("reference_models.py", "check-hf " + test::quoted(sharded) + " --inputs " +
                                        test::quoted(dir / "inputs.safetensors") + " --image " + test::quoted(image) +
                                        " --ref " + test::quoted(dir / "check_sharded.safetensors"));
  const auto theirs = safetensors::read(dir / "check.safetensors");
  expect_same_logits(ours, theirs, "hf export");
  torch::Tensor pixels;
  our_logits(model, image, &pixels);
  EXPECT_LE(max_abs_diff(pixels, theirs.tensor("pixels")), 1e-5) << "ViTImageProcessor reads another preprocessing";
  expect_within_one_level(pixels, theirs.tensor("pixels_torchvision"), model.preprocess);
  EXPECT_NE(labels.find("class 4"), std::string::npos) << labels;
  auto again = load_model(out);
  EXPECT_EQ(again.class_names, model.class_names);
  EXPECT_LE(max_abs_diff(again.net->forward(theirs.tensor("pixels")), model.net->forward(theirs.tensor("pixels"))),
            1e-6);
  std::cout << "hf export in " << shards.size() << " shards\n";
  expect_same_logits(ours, safetensors::read(dir / "check_sharded.safetensors"), "sharded hf export");
}

// A timm model that centre-crops (crop_pct 0.9) goes to transformers with a BitImageProcessor: the shorter side to
// floor(48 / 0.9) = 53, the ratio kept, then the centre crop. Loaded by AutoImageProcessor (PIL backend), it gives
// `vit predict`'s pixels and logits on the timm model for a photo whose crop margins centre alike (50x70: 5 and 26
// pixels); where a margin is 3 mod 4 (37x50: 23 columns) transformers puts the odd pixel left (floor), timm right
// (round), and vit reading the exported folder crops as transformers does (crop_offset floor): pixel-exact on both.
TEST(ExportHf, CroppingTimmModelThroughBitImageProcessor) {
  SKIP_WITHOUT_PYTHON("timm", "transformers", "safetensors");
  TempDir dir;
  const std::string snap = dir / "snapshot", odd = dir / "odd_37x50.png", even = dir / "even_50x70.png";
  run_python("reference_models.py", "timm-snapshot " + test::quoted(snap) +
                                        " --arch vit_tiny_patch16_224 --args '{\"depth\": 2, \"img_size\": 48, "
                                        "\"num_classes\": 5}' --image " + test::quoted(odd) + " --ref " +
                                        test::quoted(dir / "ref"));
  write_image(even, to_bgr(test::gradient_image(50, 70, 3)));
  auto timm_model = load_model(snap);
  ASSERT_EQ(timm_model.preprocess.crop_pct, 0.9);
  ASSERT_EQ(timm_model.preprocess.crop_mode, CropMode::center);
  const std::string out = dir / "hf";
  export_model(timm_model, {ExportFormat::hf, out, false});
  const auto written = nlohmann::json::parse(read_file(out + "/preprocessor_config.json"));
  EXPECT_EQ(written["image_processor_type"], "BitImageProcessor");
  EXPECT_EQ(written["size"].dump(), R"({"shortest_edge":53})");
  const auto printed = run_python("reference_models.py", "check-hf-images " + test::quoted(out) + " --images " +
                                                             test::quoted(even) + " " + test::quoted(odd) +
                                                             " --ref " + test::quoted(dir / "theirs.safetensors"));
  EXPECT_NE(printed.find("\"processor\": \"BitImageProcessorPil\""), std::string::npos) << printed;
  const auto theirs = safetensors::read(dir / "theirs.safetensors");
  auto hf_model = load_model(out);
  EXPECT_EQ(hf_model.preprocess.crop_offset, CropOffset::floor);
  EXPECT_EQ(hf_model.preprocess.crop_mode, CropMode::center);
  EXPECT_EQ(source_of(hf_model, "preprocess"), "preprocessor_config.json: BitImageProcessor");
  // vit predict on the timm snapshot, both photos at once.
  const auto predicted = test::run_vit("predict --checkpoint " + test::quoted(snap) + " --json " + test::quoted(even) +
                                       " " + test::quoted(odd));
  ASSERT_EQ(predicted.status, 0) << predicted.errors;
  const auto predictions = nlohmann::json::parse(predicted.output);
  ASSERT_EQ(predictions.size(), 2u);
  const std::vector<std::string> images{even, odd};
  for (size_t i = 0; i < images.size(); ++i) {
    const std::string k = "." + std::to_string(i);
    const auto their_pixels = theirs.tensor("pixels" + k), their_logits = theirs.tensor("logits" + k);
    torch::Tensor timm_pixels, hf_pixels;
    our_logits(timm_model, images[i], &timm_pixels);
    const auto hf_logits = our_logits(hf_model, images[i], &hf_pixels);
    const auto predict_logits = torch::tensor(predictions[i]["logits"].get<std::vector<float>>()).unsqueeze(0);
    const double hf_pixel_diff = max_abs_diff(hf_pixels, their_pixels);
    const double hf_logit_diff = max_abs_diff(hf_logits, their_logits);
    const double timm_pixel_diff = max_abs_diff(timm_pixels, their_pixels);
    const double predict_diff = max_abs_diff(predict_logits, their_logits);
    std::cout << std::filesystem::path(images[i]).filename().string() << ": exported folder in vit vs transformers (PIL): max |d| pixels " << hf_pixel_diff
              << ", logits " << hf_logit_diff << "; vit predict on the timm model vs transformers: pixels "
              << timm_pixel_diff << ", logits " << predict_diff << "\n";
    expect_within_one_level(hf_pixels, theirs.tensor("pixels_torchvision" + k), hf_model.preprocess);
    EXPECT_LE(hf_pixel_diff, 1e-5) << images[i];
    EXPECT_LE(hf_logit_diff, kLogitTolerance) << images[i];
    if (i == 0) {  // margins that centre alike: the export reproduces the timm model
      EXPECT_LE(timm_pixel_diff, 1e-5);
      EXPECT_LE(predict_diff, kLogitTolerance);
    } else {  // a 23-column margin: transformers' crop starts one column left of timm's
      EXPECT_GT(timm_pixel_diff, 1e-3) << "the odd margin no longer tells the two crops apart";
    }
  }
}

TEST(Export, WhatTheFormatCannotRepresentFailsAndLeavesNothing) {
  TempDir dir;
  ModelConfig avg = test::tiny_vit(16, 8, 3, 2, 16, 1, 2, 2.0);
  avg.global_pool = GlobalPool::avg;
  auto model = our_model(avg, Preprocess{}, dir / "avg.safetensors");
  EXPECT_NE(error_of([&] { export_model(model, {ExportFormat::hf, dir / "hf", false}); }).find("global_pool \"avg\""),
            std::string::npos);
  ModelConfig registers = test::tiny_vit(16, 8, 3, 2, 16, 1, 2, 2.0);
  registers.reg_tokens = 2;
  auto with_registers = our_model(registers, Preprocess{}, dir / "reg.safetensors");
  EXPECT_NE(error_of([&] { export_model(with_registers, {ExportFormat::hf, dir / "hf", false}); })
                .find("hf format cannot represent register tokens"),
            std::string::npos);
  ModelConfig eps = test::tiny_vit(16, 8, 3, 2, 16, 1, 2, 2.0);
  eps.layer_norm_eps = 1e-4;
  auto other_eps = our_model(eps, Preprocess{}, dir / "eps.safetensors");
  EXPECT_NE(error_of([&] { export_model(other_eps, {ExportFormat::timm, dir / "timm", false}); })
                .find("layer_norm_eps 0.0001"),
            std::string::npos);
  ModelConfig rel = test::tiny_vit(16, 8, 3, 2, 16, 1, 2, 2.0);
  rel.rel_pos_bias = true;
  auto relative = our_model(rel, Preprocess{}, dir / "rel.safetensors");
  EXPECT_NE(error_of([&] { export_model(relative, {ExportFormat::timm, dir / "timm", false}); })
                .find("relative position bias"),
            std::string::npos);
  Preprocess cropped;
  cropped.crop_pct = 0.9;
  ModelConfig rectangle = test::tiny_vit(16, 8, 3, 2, 16, 1, 2, 2.0);
  rectangle.img_w = 24;
  auto token = our_model(rectangle, cropped, dir / "token.safetensors");
  EXPECT_NE(error_of([&] { export_model(token, {ExportFormat::hf, dir / "hf", false}); })
                .find("crop_mode center at the rectangular size 16x24"),
            std::string::npos);
  // An existing folder is never merged into or replaced.
  make_dirs(dir / "taken");
  const auto taken = error_of([&] { export_model(token, {ExportFormat::timm, dir / "taken", false}); });
  EXPECT_NE(taken.find("already exists"), std::string::npos) << taken;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    const auto name = entry.path().filename().string();
    EXPECT_TRUE(name.find(".safetensors") != std::string::npos || name == "taken") << "left behind: " << name;
  }
}

TEST(Snapshot, RefusesPickleAndWhatWeLackByName) {
  TempDir dir;
  // A pickle checkpoint, by name or by its first bytes: refused, never unpickled.
  test::write_bytes(dir / "model.bin", std::string("PK\3\4rest of a zip", 17));
  const auto pickle = error_of([&] { load_model(dir / "model.bin"); });
  EXPECT_NE(pickle.find(dir / "model.bin"), std::string::npos) << pickle;
  EXPECT_NE(pickle.find("safetensors"), std::string::npos) << pickle;
  test::write_bytes(dir / "model.weights", std::string("PK\3\4\x14\0\0\0\x08\0", 10));  // a zip, whatever its name
  EXPECT_NE(error_of([&] { refuse_pickle(dir / "model.weights"); }).find("pickle checkpoint"), std::string::npos);
  // A safetensors file whose 640-byte header length starts with the bytes of a pickle's protocol 2 is not one.
  test::write_bytes(dir / "640.safetensors", std::string("\x80\x02\0\0\0\0\0\0{}", 10));
  EXPECT_EQ(error_of([&] { refuse_pickle(dir / "640.safetensors"); }), "(no error)");
  test::write_bytes(dir / "torch_only/pytorch_model.bin", std::string("\x80\x02}q\0.", 6));
  test::write_bytes(dir / "torch_only/config.json", R"({"architecture": "vit_tiny_patch16_224"})");
  EXPECT_NE(error_of([&] { load_model(dir / "torch_only"); }).find("pytorch_model.bin: a pickle checkpoint"),
            std::string::npos);

  auto refusal = [&](const std::string& name, const std::string& config) {
    test::write_bytes(dir / (name + "/config.json"), config);
    test::write_bytes(dir / (name + "/model.safetensors"), "");
    return error_of([&] { load_model(dir / name); });
  };
  EXPECT_NE(refusal("parallel", R"({"architecture": "vit_base_patch16_xp_224.untrained", "num_classes": 0})")
                .find("needs parallel or residual-post-norm blocks"),
            std::string::npos);
  EXPECT_NE(refusal("attn_layer", R"({"architecture": "vit_small_patch16_224",
                                      "model_args": {"attn_layer": "diff"}})")
                .find("model_args.attn_layer = \"diff\" is not supported"),
            std::string::npos);
  EXPECT_NE(refusal("act", R"({"architecture": "vit_small_patch16_224", "model_args": {"act_layer": "relu"}})")
                .find("model_args.act_layer: \"relu\" is not one of: gelu, quick_gelu, gelu_tanh, silu"),
            std::string::npos);
  // The norms and the MLP's form come with the architecture name: model_args may repeat them, not change them.
  EXPECT_NE(refusal("norm", R"({"architecture": "vit_small_patch16_224", "model_args": {"norm_layer": "rmsnorm"}})")
                .find("model_args.norm_layer = \"rmsnorm\" differs from the architecture's \"layernorm\""),
            std::string::npos);
  // Fields of the one list are read with the config's checked readers; ours that timm lacks are not timm's options.
  EXPECT_NE(refusal("width", R"({"architecture": "vit_small_patch16_224", "model_args": {"embed_dim": "wide"}})")
                .find("config.json: model_args.embed_dim: \"wide\" is not an integer"),
            std::string::npos);
  EXPECT_NE(refusal("eps", R"({"architecture": "vit_small_patch16_224", "model_args": {"layer_norm_eps": 1e-05}})")
                .find("model_args.layer_norm_eps = 1e-05 is not an option vit knows"),
            std::string::npos);
  // timm's pos_drop_rate and patch_drop_rate are fields: read, not passed over (they were, before vit had them).
  refusal("pos_drop", R"({"architecture": "vit_small_patch16_224", "model_args": {"pos_drop_rate": 0.1}})");
  EXPECT_EQ(read_snapshot(dir / "pos_drop").model.pos_drop_rate, 0.1);
  refusal("patch_drop", R"({"architecture": "vit_small_patch16_224", "model_args": {"patch_drop_rate": 0.5}})");
  EXPECT_EQ(read_snapshot(dir / "patch_drop").model.patch_drop_rate, 0.5);
  EXPECT_NE(refusal("hf_width", R"({"model_type": "vit", "hidden_size": [768]})")
                .find("config.json: hidden_size: [768] is not an integer"),
            std::string::npos);
  EXPECT_NE(refusal("deit", R"({"model_type": "deit"})").find("distillation token"), std::string::npos);
  EXPECT_NE(refusal("deit_distilled", R"({"architecture": "deit_base_distilled_patch16_224"})").find("dist_token"),
            std::string::npos);
  // timm's DeiT without distillation is its plain ViT: the sizes come from the name.
  refusal("deit_small", R"({"architecture": "deit_small_patch16_224.fb_in1k", "num_classes": 1000,
                            "pretrained_cfg": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
                                               "crop_pct": 0.875}})");
  const auto deit = read_snapshot(dir / "deit_small");
  EXPECT_EQ(deit.model.embed_dim, 384);
  EXPECT_EQ(deit.model.num_heads, 6);
  EXPECT_EQ(deit.preprocess.crop_pct, 0.875);
  EXPECT_NE(refusal("gelu", R"({"model_type": "vit", "hidden_act": "gelu_new"})").find("hidden_act \"gelu_new\""),
            std::string::npos);
  // timm's Eva class: what it lacks by name; DINOv3 in transformers' layout: the biases and MLPs it can hold.
  EXPECT_NE(refusal("mrope", R"({"architecture": "vit_small_patch16_rope_224",
                                 "model_args": {"rope_mrope_section": [8, 8]}})")
                .find("model_args.rope_mrope_section = [8,8] is not supported"),
            std::string::npos);
  // Grouped-query attention needs AttentionRope's separate projections (timm asserts the same).
  EXPECT_NE(refusal("kv_heads", R"({"architecture": "vit_small_patch16_rope_224", "model_args": {"num_kv_heads": 2}})")
                .find("model.num_kv_heads: grouped-query attention needs attn_type \"rope\" and qkv_fused false"),
            std::string::npos);
  EXPECT_NE(refusal("dinov3_bias", R"({"model_type": "dinov3_vit", "query_bias": false})")
                .find("query_bias false, key_bias false, value_bias true is not supported"),
            std::string::npos);
  EXPECT_NE(refusal("dinov3_act", R"({"model_type": "dinov3_vit", "use_gated_mlp": true})")
                .find("hidden_act \"gelu\" is not supported with use_gated_mlp true"),
            std::string::npos);
  EXPECT_NE(refusal("dinov3_mlp_bias", R"({"model_type": "dinov3_vit", "mlp_bias": false})")
                .find("mlp_bias differs from proj_bias"),
            std::string::npos);
  const auto unbiased = read_snapshot(
      (refusal("dinov3_unbiased", R"({"model_type": "dinov3_vit", "proj_bias": false, "mlp_bias": false})"),
       dir / "dinov3_unbiased"));
  EXPECT_FALSE(unbiased.model.proj_bias);
  const auto dinov3 = read_snapshot((refusal("dinov3", R"({"model_type": "dinov3_vit", "image_size": 64})"), dir / "dinov3"));
  EXPECT_EQ(dinov3.model.model_class, ModelClass::eva);
  EXPECT_EQ(dinov3.model.rope_type, RopeType::dinov3);
  EXPECT_EQ(dinov3.preprocess.mean, (std::vector<double>{0.485, 0.456, 0.406}));  // DINOv3ViTImageProcessor's
  EXPECT_EQ(dinov3.model.rope_rescale_coords, 2.0);  // pos_embed_rescale's default, applied in training only
  EXPECT_FALSE(dinov3.model.rope_shift_coords.has_value());
  EXPECT_NE(refusal("empty", R"({"foo": 1})").find("neither a timm config"), std::string::npos);
  EXPECT_NE(error_of([&] { load_model(dir.path()); }).find("without config.json"), std::string::npos);
}

// Hugging Face processors as our preprocessing: ViTImageProcessor squashes; BiT / CLIP resize the shortest edge (or
// both sides) and centre-crop with the floor offset; what vit's preprocessing cannot hold fails naming the key.
// Every field of the model's one list goes out and comes back through a format's config.json; a timm snapshot holds
// all but the epsilon (its architecture name's), the relative bias and the training-time rates.
TEST(Snapshot, ModelFieldsRoundTripThroughTimmAndHfConfigs) {
  TempDir dir;
  Preprocess squash;  // a rectangle HF's ViTImageProcessor resizes to
  squash.crop_mode = CropMode::squash;
  squash.crop_pct = 1.0;
  auto round_trip = [&](SnapshotKind kind, const ModelConfig& m) {
    const std::string folder = dir / name_of(kind);
    std::filesystem::create_directories(folder);
    for (const auto& [name, content] : snapshot_files(kind, m, squash, {})) {
      test::write_bytes(folder + "/" + name, content.dump());
    }
    test::write_bytes(folder + "/model.safetensors", "");
    return read_snapshot(folder).model;
  };
  ModelConfig timm = test::tiny_vit(32, 8, 1, 5, 24, 2, 3, 2.0);
  timm.img_w = 48;
  timm.qkv_bias = false;
  timm.class_token = false;
  timm.reg_tokens = 2;
  timm.no_embed_class = true;
  timm.pre_norm = true;
  timm.global_pool = GlobalPool::map;
  timm.qk_norm = true;
  timm.act_layer = Activation::quick_gelu;
  timm.init_values = 1e-3;
  timm.fc_norm = true;
  timm.final_norm = true;
  const ModelConfig timm_back = round_trip(SnapshotKind::timm, timm);
  EXPECT_EQ(to_json(timm_back).dump(), to_json(timm).dump());

  ModelConfig hf = test::tiny_vit(32, 8, 1, 5, 24, 2, 3, 2.0);
  hf.img_w = 48;
  hf.qkv_bias = false;
  hf.layer_norm_eps = 1e-5;
  const ModelConfig hf_back = round_trip(SnapshotKind::hf, hf);
  EXPECT_EQ(to_json(hf_back).dump(), to_json(hf).dump());
  // HF's ViT holds none of the family's options: a refusal names every one the model has.
  const std::string refused = error_of([&] { snapshot_files(SnapshotKind::hf, timm, squash, {}); });
  for (const char* what : {"without a class token", "global_pool \"map\"", "LayerScale", "register tokens",
                           "without the class slot", "pre_norm", "model.qk_norm true", "model.fc_norm"}) {
    EXPECT_NE(refused.find(what), std::string::npos) << what << " in: " << refused;
  }
  // timm's model_args cannot say the norms or the MLP's form: a combination no architecture name has is refused,
  // as is what timm's Eva lacks.
  ModelConfig rms = test::tiny_vit(32, 8, 1, 5, 24, 2, 3, 2.0);
  rms.norm_layer = NormLayer::rmsnorm;  // with 1e-6: AIMv2's is 1e-5
  EXPECT_NE(error_of([&] { snapshot_files(SnapshotKind::timm, rms, squash, {}); })
                .find("timm format cannot represent norm_layer rmsnorm with layer_norm_eps 1e-06, embed_norm_layer "
                      "none and mlp_layer mlp in timm's VisionTransformer"),
            std::string::npos);
  ModelConfig eva = test::tiny_vit(32, 8, 1, 5, 24, 2, 3, 2.0);
  eva.model_class = ModelClass::eva, eva.proj_bias = false;
  EXPECT_NE(error_of([&] {
              snapshot_files(SnapshotKind::timm, eva, squash, {});
            }).find("model.proj_bias false with model_class eva"),
            std::string::npos);
}

TEST(Snapshot, HfProcessorsThatCropAndTheirRefusals) {
  TempDir dir;
  int case_number = 0;
  auto read = [&](const nlohmann::json& processor, Snapshot* out) {
    const std::string folder = dir / ("case" + std::to_string(case_number++));
    test::write_bytes(folder + "/config.json", R"({"model_type": "vit", "image_size": 48, "patch_size": 16,
        "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "layer_norm_eps": 1e-6})");
    test::write_bytes(folder + "/model.safetensors", "");
    test::write_bytes(folder + "/preprocessor_config.json", processor.dump());
    return error_of([&] { *out = read_snapshot(folder); });
  };
  Snapshot s;
  ASSERT_EQ(read({{"image_processor_type", "CLIPImageProcessor"}, {"size", {{"shortest_edge", 54}}},
                  {"crop_size", {{"height", 48}, {"width", 48}}}},
                 &s),
            "(no error)");
  EXPECT_EQ(s.preprocess.crop_mode, CropMode::center);
  EXPECT_EQ(s.preprocess.crop_offset, CropOffset::floor);
  EXPECT_EQ(s.preprocess.interpolation, Interpolation::bicubic);  // the class's default
  EXPECT_NEAR(s.preprocess.mean[0], 0.48145466, 1e-9);            // OpenAI CLIP's
  EXPECT_EQ(eval_scale(48, s.preprocess.crop_pct), 54);
  EXPECT_EQ(eval_resize_shape(100, 60, s.preprocess, 48, 48).height, 90);  // int(54 * 100 / 60)
  // Python's floor(48 / (48 / 59)) is 58: the timm export writes a crop_pct that gives timm 59 back.
  ASSERT_EQ(read({{"image_processor_type", "BitImageProcessor"}, {"size", {{"shortest_edge", 59}}},
                  {"crop_size", {{"height", 48}, {"width", 48}}}},
                 &s),
            "(no error)");
  EXPECT_EQ(eval_scale(48, s.preprocess.crop_pct), 59);
  const double timm_pct =
      snapshot_files(SnapshotKind::timm, s.model, s.preprocess, {})["config.json"]["pretrained_cfg"]["crop_pct"];
  EXPECT_EQ(std::floor(48.0 / timm_pct), 59.0) << timm_pct;
  ASSERT_EQ(read({{"image_processor_type", "BitImageProcessorPil"}, {"size", {{"height", 56}, {"width", 56}}},
                  {"crop_size", {{"height", 48}, {"width", 48}}}, {"resample", 2}},
                 &s),
            "(no error)");
  EXPECT_EQ(s.preprocess.crop_mode, CropMode::squash);
  EXPECT_EQ(eval_resize_shape(100, 60, s.preprocess, 48, 48).width, 56);
  EXPECT_EQ(s.preprocess.interpolation, Interpolation::bilinear);
  ASSERT_EQ(read({{"image_processor_type", "ViTImageProcessor"}}, &s), "(no error)");
  EXPECT_EQ(s.preprocess.crop_mode, CropMode::squash);
  EXPECT_EQ(s.preprocess.crop_offset, CropOffset::round);  // no crop at all: either rule
  EXPECT_EQ(s.preprocess.crop_pct, 1.0);

  auto refused = [&](const nlohmann::json& processor, const std::string& expected) {
    const auto error = read(processor, &s);
    EXPECT_NE(error.find("preprocessor_config.json: "), std::string::npos) << error;
    EXPECT_NE(error.find(expected), std::string::npos) << error;
  };
  refused({{"image_processor_type", "ConvNextImageProcessor"}}, "image_processor_type \"ConvNextImageProcessor\"");
  refused({{"image_processor_type", "BitImageProcessor"}, {"size", {{"shortest_edge", 54}}},
           {"crop_size", {{"height", 32}, {"width", 32}}}},
          "crop_size {\"height\":32,\"width\":32} differs from the model's image_size 48x48");
  refused({{"image_processor_type", "BitImageProcessor"}, {"size", {{"shortest_edge", 40}}},
           {"crop_size", {{"height", 48}, {"width", 48}}}},
          "size.shortest_edge 40 is smaller than crop_size 48x48");
  refused({{"image_processor_type", "BitImageProcessor"}, {"size", {{"height", 56}, {"width", 64}}},
           {"crop_size", {{"height", 48}, {"width", 48}}}},
          "crop the two sides by different fractions");
  refused({{"image_processor_type", "BitImageProcessor"}, {"size", {{"shortest_edge", 54}}},
           {"do_center_crop", false}},
          "and nothing crops it");
  refused({{"image_processor_type", "ViTImageProcessor"}, {"size", {{"height", 32}, {"width", 32}}}},
          "differs from the model's image_size 48x48");
}

TEST(SnapshotNames, EveryTimmTensorHasOneHfNameAndBack) {
  ModelConfig config = test::tiny_vit(16, 8, 3, 2, 16, 2, 2, 2.0);
  VisionTransformer net(config);
  std::vector<std::string> hf;
  std::map<std::string, std::string> ours_of;
  for (const auto& [name, tensor] : state_tensors(net)) {
    if (name.find(".attn.qkv.") != std::string::npos) {
      for (const auto& part : hf_qkv_names(name)) hf.push_back(part), ours_of[part] = name;
    } else {
      ASSERT_FALSE(hf_name(name).empty()) << name;
      hf.push_back(hf_name(name)), ours_of[hf_name(name)] = name;
    }
  }
  const auto back = snapshot_names(SnapshotKind::hf, ModelConfig{}, hf, "x");
  EXPECT_EQ(back.size(), state_tensors(net).size());
  for (const auto& [ours, theirs] : back) {
    for (const auto& name : theirs) EXPECT_EQ(ours_of.at(name), ours);
  }
  EXPECT_NE(error_of([&] {
              snapshot_names(SnapshotKind::hf, ModelConfig{}, {"vit.encoder.layer.0.crossattention.w"}, "f");
            }).find("f: tensors that a Hugging Face ViT does not have: vit.encoder.layer.0.crossattention.w"),
            std::string::npos);
}

TEST(SnapshotCli, PredictAndInfoNeedNoConfig) {
  SKIP_WITHOUT_PYTHON("timm", "safetensors");
  TempDir dir;
  const std::string snap = dir / "snapshot", image = dir / "image.png";
  run_python("reference_models.py", "timm-snapshot " + test::quoted(snap) +
                                        " --arch vit_tiny_patch16_224 --args '{\"depth\": 1, \"img_size\": 32, "
                                        "\"num_classes\": 5}' --labels '[\"a\", \"b\", \"c\", \"d\", \"e\"]'"
                                        " --image " + test::quoted(image) + " --ref " + test::quoted(dir / "ref"));
  const auto info = test::run_vit("info --checkpoint " + test::quoted(snap));
  ASSERT_EQ(info.status, 0) << info.errors;
  EXPECT_NE(info.output.find("preprocess  from config.json: pretrained_cfg"), std::string::npos) << info.output;
  EXPECT_NE(info.output.find("class_names from config.json: label_names"), std::string::npos) << info.output;
  const auto predict = test::run_vit("predict --checkpoint " + test::quoted(snap) + " --json " + test::quoted(image));
  ASSERT_EQ(predict.status, 0) << predict.errors;
  EXPECT_NE(predict.output.find("\"label\""), std::string::npos) << predict.output;
  const auto exported = test::run_vit("export --checkpoint " + test::quoted(snap) + " --format vit --out " +
                                      test::quoted(dir / "ours.safetensors"));
  ASSERT_EQ(exported.status, 0) << exported.errors;
  EXPECT_EQ(load_model(dir / "ours.safetensors").class_names, (std::vector<std::string>{"a", "b", "c", "d", "e"}));
}

// A random two-block ViT-S/16 (width 48, 3 heads) at 32x32 with 5 classes, saved by timm's save_for_hf, and the
// non-square image reference_models.py writes beside it.
void small_timm_snapshot(const std::string& snap, const std::string& image, const std::string& ref) {
  run_python("reference_models.py", "timm-snapshot " + test::quoted(snap) +
                                        " --arch vit_small_patch16_224 --args '{\"depth\": 2, \"embed_dim\": 48, "
                                        "\"num_heads\": 3, \"img_size\": 32, \"num_classes\": 5}'"
                                        " --image " + test::quoted(image) + " --ref " + test::quoted(ref));
}

// The README's one command: a timm snapshot out to ONNX, run by onnxruntime on our preprocessed image and a batch
// of 3, with each block's attention as outputs and our metadata in the file.
TEST(ExportOnnxCli, TimmSnapshotToOnnxRunsInOnnxruntime) {
  SKIP_WITHOUT_PYTHON("timm", "onnx", "onnxruntime");
  if (!onnx_export_available()) GTEST_SKIP() << "built without ONNX support (VIT_WITH_ONNX=OFF)";
  TempDir dir;
  const std::string snap = dir / "snapshot", image = dir / "image.png", onnx = dir / "out/model.onnx";
  small_timm_snapshot(snap, image, dir / "ref");
  const auto exported = test::run_vit("export --checkpoint " + test::quoted(snap) + " --format onnx --attention --out " +
                                      test::quoted(onnx));
  ASSERT_EQ(exported.status, 0) << exported.errors;
  auto model = load_model(snap);
  torch::Tensor pixels;
  const auto logits = our_logits(model, image, &pixels);
  torch::manual_seed(5);
  const auto batch = torch::randn({3, 3, 32, 32});
  safetensors::write(dir / "in.safetensors", {{"image", pixels}, {"batch", batch}}, {});
  const auto printed = run_python("reference_onnx.py", test::quoted(onnx) + " " + test::quoted(dir / "in.safetensors") +
                                                           " " + test::quoted(dir / "out.safetensors"));
  const auto theirs = safetensors::read(dir / "out.safetensors");
  torch::NoGradGuard no_grad;
  const double image_diff = max_abs_diff(logits, theirs.tensor("image/logits"));
  const double batch_diff = max_abs_diff(model.net->forward(batch), theirs.tensor("batch/logits"));
  Capture capture;
  capture.attention = true;
  model.net->forward_features(batch, {}, &capture);
  const double attention_diff = max_abs_diff(capture.attention_probs[1], theirs.tensor("batch/attention.1"));
  std::cout << "onnx export: max |d| logits " << image_diff << " (image), " << batch_diff << " (batch 3), attention "
            << attention_diff << "\n";
  EXPECT_LE(image_diff, kLogitTolerance);
  EXPECT_LE(batch_diff, kLogitTolerance);
  EXPECT_LE(attention_diff, 1e-5);
  const auto info = nlohmann::json::parse(printed);
  bool has_classes = false;
  for (const auto& prop : info["metadata_props"]) has_classes = has_classes || prop[0] == "class_names";
  EXPECT_TRUE(has_classes) << printed;
  EXPECT_EQ(info["inputs"][0]["name"], "pixel_values");
  EXPECT_EQ(info["outputs"][0]["name"], "logits");
  // A failed export leaves nothing: an unrepresentable request, and a directory in the way.
  const auto bad = test::run_vit("export --checkpoint " + test::quoted(snap) + " --format timm --attention --out " +
                                 test::quoted(dir / "x"));
  EXPECT_EQ(bad.status, 2) << bad.errors;
  EXPECT_FALSE(file_exists(dir / "x"));
}

// --dynamic-size with --external-data through the CLI: one ONNX file (graph + model.onnx.data) gives, in onnxruntime,
// the logits `vit predict --img-size` prints at the trained size, a larger one and a rectangular one.
TEST(ExportOnnxCli, DynamicSizeMatchesPredictAtThreeSizes) {
  SKIP_WITHOUT_PYTHON("timm", "onnx", "onnxruntime");
  if (!onnx_export_available()) GTEST_SKIP() << "built without ONNX support (VIT_WITH_ONNX=OFF)";
  TempDir dir;
  const std::string snap = dir / "snapshot", image = dir / "image.png", onnx = dir / "out/model.onnx";
  small_timm_snapshot(snap, image, dir / "ref");
  const auto exported = test::run_vit("export --checkpoint " + test::quoted(snap) +
                                      " --format onnx --dynamic-size --external-data --out " + test::quoted(onnx));
  ASSERT_EQ(exported.status, 0) << exported.errors;
  EXPECT_TRUE(file_exists(onnx + ".data"));
  EXPECT_NE((exported.output + exported.errors).find("model.onnx.data"), std::string::npos) << exported.errors;
  const auto model = load_model(snap);
  const auto& m = model.config();
  safetensors::NamedTensors inputs;
  std::map<std::string, torch::Tensor> predicted;
  for (const auto& [h, w] : std::vector<std::pair<int64_t, int64_t>>{{32, 32}, {48, 48}, {32, 64}}) {
    const std::string size = std::to_string(h) + "x" + std::to_string(w);
    const auto run = test::run_vit("predict --checkpoint " + test::quoted(snap) + " --img-size " + size + " --json " +
                                   test::quoted(image));
    ASSERT_EQ(run.status, 0) << run.errors;
    const auto logits = nlohmann::json::parse(run.output)[0]["logits"].get<std::vector<float>>();
    predicted[size] = torch::tensor(logits).unsqueeze(0);
    inputs.emplace_back(size, preprocess(decode_image(image), model.preprocess, h, w, m.in_chans).unsqueeze(0));
  }
  safetensors::write(dir / "in.safetensors", inputs, {});
  const auto printed = run_python("reference_onnx.py", test::quoted(onnx) + " " + test::quoted(dir / "in.safetensors") +
                                                           " " + test::quoted(dir / "out.safetensors"));
  const auto info = nlohmann::json::parse(printed);
  EXPECT_EQ(info["inputs"][0]["shape"].dump(), R"(["batch",3,"height","width"])");
  const auto theirs = safetensors::read(dir / "out.safetensors");
  for (const auto& [size, logits] : predicted) {
    const double diff = max_abs_diff(logits, theirs.tensor(size + "/logits"));
    std::cout << "dynamic-size onnx at " << size << ": max |d| logits vs vit predict " << diff << "\n";
    EXPECT_LE(diff, kLogitTolerance) << size;
  }
}

// The timm family downstream, through the CLI: a model with register tokens, no class token, a MAP head, qk_norm,
// pre_norm and quick_gelu trains from a config, evaluates, explains (maps over the patches, read through the MAP
// head's pooling attention), exports to a timm folder that timm loads strictly with our logits, and fine-tunes from
// that folder at another size (pos_embed resampled without prefix rows: no_embed_class).
TEST(FamilyCli, TrainEvaluateExplainExportAndFinetune) {
  TempDir dir;
  test::write_idx_dataset(dir / "data", 512, 128);
  nlohmann::json model = {{"img_size", 16},        {"patch_size", 4},      {"in_chans", 1},
                          {"num_classes", 4},      {"embed_dim", 32},      {"depth", 2},
                          {"num_heads", 4},        {"mlp_ratio", 2.0},     {"class_token", false},
                          {"reg_tokens", 2},       {"no_embed_class", true}, {"global_pool", "map"},
                          {"qk_norm", true},       {"pre_norm", true},     {"act_layer", "quick_gelu"},
                          {"layer_norm_eps", 1e-5}, {"init_values", 0.1}};
  nlohmann::json doc = {
      {"model", model},
      {"data", {{"format", "mnist"}, {"root", dir / "data"}, {"mean", {0.5}}, {"std", {0.5}}, {"num_workers", 2}}},
      {"train", {{"epochs", 3}, {"batch_size", 16}, {"lr", 2e-3}, {"warmup_steps", 5}, {"threads", 2}, {"seed", 7},
                 {"output_root", dir / "runs"}}}};
  test::write_bytes(dir / "config.json", doc.dump(2));
  const auto trained = test::run_vit("train --config " + test::quoted(dir / "config.json") + " --out " +
                                     test::quoted(dir / "run"));
  ASSERT_EQ(trained.status, 0) << trained.errors;
  const std::string best = dir / "run/best.safetensors";
  const auto evaluated = test::run_vit("evaluate --checkpoint " + test::quoted(best) + " --config " +
                                       test::quoted(dir / "config.json") + " --json");
  ASSERT_EQ(evaluated.status, 0) << evaluated.errors;
  const auto metrics = nlohmann::json::parse(evaluated.output);
  std::cout << "family model: " << metrics.dump() << "\n";
  EXPECT_GT(metrics["top1"].get<double>(), 80.0);

  const auto explained = test::run_vit("export-attention --checkpoint " + test::quoted(best) + " --out " +
                                       test::quoted(dir / "maps") + " --grad-rollout " +
                                       test::quoted(test::data_path("tiny32/chelsea.png")));
  ASSERT_EQ(explained.status, 0) << explained.errors;
  EXPECT_EQ(read_npy(dir / "maps/chelsea/rollout.npy").sizes(), (std::vector<int64_t>{4, 4}));  // patches only
  EXPECT_EQ(read_npy(dir / "maps/chelsea/attn_1.npy").sizes(), (std::vector<int64_t>{4, 18, 18}));  // 2 + 16 tokens
  EXPECT_EQ(read_npy(dir / "maps/chelsea/pool_attn.npy").sizes(), (std::vector<int64_t>{4, 16}));
  const auto summary = nlohmann::json::parse(read_file(dir / "maps/chelsea/summary.json"));
  EXPECT_EQ(summary["model"]["prefix_tokens"], 2);
  EXPECT_NE(summary["method"]["rollout"]["readout"].get<std::string>().find("MAP head"), std::string::npos);

  const std::string timm_dir = dir / "timm";
  const auto exported = test::run_vit("export --checkpoint " + test::quoted(best) + " --format timm --out " +
                                      test::quoted(timm_dir));
  ASSERT_EQ(exported.status, 0) << exported.errors;
  if (!test::reference_python({"timm", "safetensors"}, nullptr).empty()) {
    auto loaded = load_model(best);
    torch::manual_seed(2);
    const auto x = torch::randn({3, 1, 16, 16});
    safetensors::write(dir / "inputs.safetensors", {{"x.0", x}});
    test::write_bytes(dir / "image.png", read_file(test::data_path("tiny32/chelsea.png")));
    run_python("reference_models.py", "check-timm " + test::quoted(timm_dir) + " --inputs " +
                                          test::quoted(dir / "inputs.safetensors") + " --image " +
                                          test::quoted(dir / "image.png") + " --ref " + test::quoted(dir / "timm.safetensors"));
    torch::NoGradGuard no_grad;
    const double diff = max_abs_diff(loaded.net->forward(x), safetensors::read(dir / "timm.safetensors").tensor("logits.0"));
    std::cout << "exported to timm: max |d| logits " << diff << "\n";
    EXPECT_LE(diff, kLogitTolerance);
  }

  doc["model"]["img_size"] = 24;
  doc["train"]["epochs"] = 2;  // from the trained weights: a short fine-tune, as the CI budget wants
  test::write_bytes(dir / "finetune.json", doc.dump(2));
  const auto tuned = test::run_vit("train --config " + test::quoted(dir / "finetune.json") + " --out " +
                                   test::quoted(dir / "tuned") + " --init-from " + test::quoted(timm_dir));
  ASSERT_EQ(tuned.status, 0) << tuned.errors;
  EXPECT_NE((tuned.output + tuned.errors).find("pos_embed resampled from a 4x4 to a 6x6 grid"), std::string::npos)
      << tuned.output << tuned.errors;
}

// timm's Eva class downstream, through the CLI: a DINOv3-style model (rotary embeddings only, halves rotated, a
// register, SwiGLU, gamma_1 / gamma_2) with a MAP head of its own 2 heads trains from a config, evaluates, embeds
// intermediate blocks, explains (the MAP head's pooling attention over all 18 tokens), exports to ONNX at its size
// and at a dynamic one, and fine-tunes from its own file at another size, where the rotary table is made for the new
// grid.
TEST(EvaCli, TrainEvaluateEmbedExplainExportAndFinetune) {
  TempDir dir;
  test::write_idx_dataset(dir / "data", 512, 128);
  nlohmann::json model = {{"model_class", "eva"},
                          {"img_size", 16},
                          {"patch_size", 4},
                          {"in_chans", 1},
                          {"num_classes", 4},
                          {"embed_dim", 32},
                          {"depth", 2},
                          {"num_heads", 4},
                          {"mlp_ratio", 2.0},
                          {"reg_tokens", 1},
                          {"use_abs_pos_emb", false},
                          {"use_rot_pos_emb", true},
                          {"rope_type", "dinov3"},
                          {"rope_temperature", 100.0},
                          {"rope_rotate_half", true},
                          {"swiglu_mlp", true},
                          {"init_values", 0.1},
                          {"global_pool", "map"},
                          {"attn_pool_num_heads", 2}};
  nlohmann::json doc = {
      {"model", model},
      {"data", {{"format", "mnist"}, {"root", dir / "data"}, {"mean", {0.5}}, {"std", {0.5}}, {"num_workers", 2}}},
      {"train",
       {{"epochs", 6},
        {"batch_size", 16},
        {"lr", 2e-3},
        {"warmup_steps", 5},
        {"threads", 2},
        {"seed", 7},
        {"output_root", dir / "runs"}}}};
  test::write_bytes(dir / "config.json", doc.dump(2));
  const auto trained =
      test::run_vit("train --config " + test::quoted(dir / "config.json") + " --out " + test::quoted(dir / "run"));
  ASSERT_EQ(trained.status, 0) << trained.errors;
  // DINOv3's options (rotary table, registers, SwiGLU, LayerScale) train on the fused CPU block.
  EXPECT_EQ((trained.output + trained.errors).find("fused CPU block not used"), std::string::npos) << trained.errors;
  const std::string best = dir / "run/best.safetensors";
  const auto evaluated = test::run_vit("evaluate --checkpoint " + test::quoted(best) + " --config " +
                                       test::quoted(dir / "config.json") + " --json");
  ASSERT_EQ(evaluated.status, 0) << evaluated.errors;
  const auto metrics = nlohmann::json::parse(evaluated.output);
  std::cout << "eva model: " << metrics.dump() << "\n";
  EXPECT_GT(metrics["top1"].get<double>(), 80.0);

  const std::string image = test::data_path("tiny32/chelsea.png");
  const auto embedded =
      test::run_vit("embed --checkpoint " + test::quoted(best) + " --out " + test::quoted(dir / "embed") +
                    " --layers 0,-1 --pool none " + test::quoted(image));
  ASSERT_EQ(embedded.status, 0) << embedded.errors;
  EXPECT_EQ(read_npy(dir / "embed/block_1.npy").sizes(), (std::vector<int64_t>{1, 18, 32}));  // 1 + 1 + 16 tokens

  const auto explained = test::run_vit("export-attention --checkpoint " + test::quoted(best) + " --out " +
                                       test::quoted(dir / "maps") + " " + test::quoted(image));
  ASSERT_EQ(explained.status, 0) << explained.errors;
  EXPECT_EQ(read_npy(dir / "maps/chelsea/rollout.npy").sizes(), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(read_npy(dir / "maps/chelsea/attn_1.npy").sizes(), (std::vector<int64_t>{4, 18, 18}));
  EXPECT_EQ(read_npy(dir / "maps/chelsea/pool_attn.npy").sizes(), (std::vector<int64_t>{2, 18}));  // every token

  if (onnx_export_available()) {
    const auto onnx = test::run_vit("export --checkpoint " + test::quoted(best) + " --format onnx --out " +
                                    test::quoted(dir / "model.onnx"));
    ASSERT_EQ(onnx.status, 0) << onnx.errors;
    const auto dynamic = test::run_vit("export --checkpoint " + test::quoted(best) +
                                       " --format onnx --dynamic-size --out " + test::quoted(dir / "dynamic.onnx"));
    EXPECT_EQ(dynamic.status, 0) << dynamic.errors;  // the rotary table computed in the graph per input
  }

  doc["model"]["img_size"] = 24;
  doc["train"]["epochs"] = 2;  // from the trained weights: a short fine-tune, as the CI budget wants
  test::write_bytes(dir / "finetune.json", doc.dump(2));
  const auto tuned = test::run_vit("train --config " + test::quoted(dir / "finetune.json") + " --out " +
                                   test::quoted(dir / "tuned") + " --init-from " + test::quoted(best));
  ASSERT_EQ(tuned.status, 0) << tuned.errors;
  const auto tuned_metrics =
      nlohmann::json::parse(test::run_vit("evaluate --checkpoint " + test::quoted(dir / "tuned/best.safetensors") +
                                          " --config " + test::quoted(dir / "finetune.json") + " --json")
                                .output);
  std::cout << "eva model fine-tuned at 24x24: " << tuned_metrics.dump() << "\n";
  EXPECT_GT(tuned_metrics["top1"].get<double>(), 80.0);
}

}  // namespace
}  // namespace vit
