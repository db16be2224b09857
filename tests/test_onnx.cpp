// ONNX export: for every model option the written file passes onnx's full checker and, run in onnxruntime, gives our
// forward pass's logits and attention probabilities at batch 1 and 3; plus the file's names, symbolic batch dim and
// metadata, and the writer's failures (a missing folder, weights or settings the graph cannot hold).
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "export/export.h"
#include "export/onnx_writer.h"
#include "io/safetensors.h"
#include "model/vit.h"
#include "test_util.h"
#include "vit/build_config.h"

namespace vit {
namespace {

#if VIT_WITH_ONNX

using test::max_abs_diff;
using test::quoted;

struct Variant {
  std::string name;
  ModelConfig model;
};

// The variant's name, not its bytes, in gtest's failure lines.
void PrintTo(const Variant& variant, std::ostream* out) { *out << variant.name; }

std::vector<Variant> variants() {
  auto base = [] { return test::tiny_vit(/*img=*/16, /*patch=*/4, /*in_chans=*/3, /*num_classes=*/5,
                                         /*embed_dim=*/32, /*depth=*/2, /*num_heads=*/4, /*mlp_ratio=*/2.0); };
  std::vector<Variant> list;
  list.push_back({"token", base()});
  auto avg = base();
  avg.class_token = false;
  avg.global_pool = GlobalPool::avg;
  list.push_back({"avg_no_class_token", avg});
  auto avg_cls = base();
  avg_cls.global_pool = GlobalPool::avg;
  avg_cls.layer_norm_eps = 1e-5;
  list.push_back({"avg_class_token_eps", avg_cls});
  auto layer_scale = base();
  layer_scale.init_values = 0.1;
  list.push_back({"layer_scale", layer_scale});
  auto rel = base();
  rel.rel_pos_bias = true;
  list.push_back({"rel_pos_bias", rel});
  auto rel_avg = avg;
  rel_avg.rel_pos_bias = true;
  list.push_back({"rel_pos_bias_no_class_token", rel_avg});
  auto rect = base();
  rect.img_w = 24;
  rect.patch_size = 8;
  rect.rel_pos_bias = true;
  list.push_back({"rect_16x24_patch8", rect});
  auto no_qkv_bias = base();
  no_qkv_bias.qkv_bias = false;
  list.push_back({"no_qkv_bias", no_qkv_bias});
  auto gray = base();
  gray.in_chans = 1;
  list.push_back({"in_chans_1", gray});
  auto headless = base();
  headless.num_classes = 0;
  list.push_back({"no_head", headless});
  // The timm family's options (model_config.h).
  auto deit3 = base();
  deit3.no_embed_class = true;
  deit3.init_values = 0.1;
  list.push_back({"no_embed_class", deit3});
  auto registers = base();
  registers.reg_tokens = 3;
  registers.no_embed_class = true;
  list.push_back({"reg_tokens", registers});
  auto registers_in_pos = base();
  registers_in_pos.reg_tokens = 2;
  registers_in_pos.num_classes = 0;
  list.push_back({"reg_tokens_pos_embed_no_head", registers_in_pos});
  auto clip = base();
  clip.pre_norm = true;
  clip.layer_norm_eps = 1e-5;
  clip.act_layer = Activation::quick_gelu;
  list.push_back({"pre_norm_quick_gelu", clip});
  auto siglip = base();
  siglip.class_token = false;
  siglip.global_pool = GlobalPool::map;
  siglip.act_layer = Activation::gelu_tanh;
  list.push_back({"map_gelu_tanh", siglip});
  auto map_registers = siglip;
  map_registers.reg_tokens = 2;
  map_registers.qk_norm = true;
  list.push_back({"map_reg_tokens_qk_norm", map_registers});
  auto gap = avg;
  gap.fc_norm = false;
  gap.reg_tokens = 1;
  list.push_back({"avg_fc_norm_false", gap});
  auto no_final = base();
  no_final.final_norm = false;
  list.push_back({"final_norm_false", no_final});
  // timm's Eva class (model_class eva): rotary embeddings as graph operations with their table as constants.
  // EVA-02's: rotary cat over a reference grid, interleaved pairs, q_bias / v_bias, packed SwiGLU, gamma_1 / gamma_2.
  auto eva02 = base();
  eva02.model_class = ModelClass::eva, eva02.use_rot_pos_emb = true, eva02.ref_feat_h = eva02.ref_feat_w = 6;
  eva02.swiglu_mlp = true, eva02.mlp_ratio = 8.0 / 3.0, eva02.init_values = 0.1, eva02.global_pool = GlobalPool::avg;
  list.push_back({"eva02_rope_swiglu", eva02});
  // RoPE-ViT mixed with EVA-02 CLIP's parts: q_proj / k_proj / v_proj (AttentionRope's k bias), split SwiGLU with
  // mlp.norm, attn.norm, gamma_1 only, a register, a MAP head of 2 heads over all tokens, no final norm.
  auto mixed = base();
  mixed.model_class = ModelClass::eva, mixed.use_abs_pos_emb = false, mixed.use_rot_pos_emb = true;
  mixed.rope_type = RopeType::mixed, mixed.rope_grid_indexing = GridIndexing::xy, mixed.attn_type = AttnType::rope;
  mixed.qkv_fused = false, mixed.swiglu_mlp = true, mixed.scale_mlp = true, mixed.scale_attn_inner = true;
  mixed.init_values = 0.1, mixed.attn_only_layer_scale = true, mixed.reg_tokens = 1;
  mixed.global_pool = GlobalPool::map, mixed.attn_pool_num_heads = 2, mixed.final_norm = false;
  list.push_back({"eva_rope_mixed_map", mixed});
  // DINOv3's: rotary periods over normalised patch centres, halves rotated, 4 registers, no qkv bias.
  auto dinov3 = base();
  dinov3.model_class = ModelClass::eva, dinov3.use_abs_pos_emb = false, dinov3.use_rot_pos_emb = true;
  dinov3.rope_type = RopeType::dinov3, dinov3.rope_temperature = 100.0, dinov3.rope_rotate_half = true;
  dinov3.reg_tokens = 4, dinov3.qkv_bias = false, dinov3.init_values = 0.1, dinov3.img_w = 24;  // a rectangle
  list.push_back({"dinov3_rope", dinov3});
  // AIMv2's: RmsNorm everywhere and on the patch embedding, SwiGLU (fc1_g / fc1_x) with SiLU, no projection biases.
  auto aimv2 = base();
  aimv2.norm_layer = NormLayer::rmsnorm, aimv2.embed_norm_layer = NormLayer::rmsnorm, aimv2.layer_norm_eps = 1e-5;
  aimv2.mlp_layer = MlpLayer::swiglu, aimv2.act_layer = Activation::silu, aimv2.proj_bias = false;
  aimv2.qkv_bias = false, aimv2.class_token = false, aimv2.global_pool = GlobalPool::avg, aimv2.fc_norm = false;
  list.push_back({"aimv2_rmsnorm_swiglu", aimv2});
  // DINOv2 giant's packed SwiGLU (one fc1, gates first) with LayerScale and registers.
  auto giant = base();
  giant.mlp_layer = MlpLayer::swiglu_packed, giant.act_layer = Activation::silu, giant.mlp_ratio = 16.0 / 3.0;
  giant.init_values = 0.1, giant.reg_tokens = 2, giant.no_embed_class = true;
  list.push_back({"giant_swiglu_packed", giant});
  // Sapiens2's grouped-query attention (2 key/value heads for 4 in the second block), AttentionRope's biases, qk_norm
  // and RmsNorm, DINOv3 rotary; EVA-02 CLIP enormous's post-norm blocks.
  auto sapiens = base();
  sapiens.model_class = ModelClass::eva, sapiens.attn_type = AttnType::rope, sapiens.qkv_fused = false;
  sapiens.num_kv_heads = {4, 2}, sapiens.qk_norm = true, sapiens.norm_layer = NormLayer::rmsnorm;
  sapiens.use_abs_pos_emb = false, sapiens.use_rot_pos_emb = true, sapiens.rope_type = RopeType::dinov3;
  sapiens.rope_rotate_half = true, sapiens.reg_tokens = 2, sapiens.swiglu_mlp = true;
  list.push_back({"sapiens2_grouped_query", sapiens});
  auto post = base();
  post.model_class = ModelClass::eva, post.use_post_norm = true, post.use_rot_pos_emb = true;
  list.push_back({"eva_post_norm", post});
  return list;
}

// A random model in eval mode whose zero-initialised weights (biases, cls_token, LayerNorm shifts, the relative
// bias table) are perturbed too, so that a graph leaving any of them out would not match.
VisionTransformer random_model(const ModelConfig& config) {
  torch::manual_seed(0);
  VisionTransformer net(config);
  net->eval();
  torch::NoGradGuard no_grad;
  for (auto& p : net->parameters()) p.add_(torch::randn_like(p) * 0.05);
  return net;
}

// The writer's input exactly as `vit export` builds it.
onnx::ExportInput export_input(VisionTransformer& net, bool attention_outputs) {
  return onnx_export_input(net, attention_outputs);
}

struct Reference {
  nlohmann::json info;           // reference_onnx.py's description of the file
  safetensors::Archive outputs;  // "<input>/<output>"
};

// Runs the file in onnxruntime on `inputs` (after onnx's full checker).
Reference run_reference(const std::string& model_path, const test::TempDir& dir,
                        const safetensors::NamedTensors& inputs) {
  const std::string in = dir / "inputs.safetensors", out = dir / "outputs.safetensors";
  safetensors::write(in, inputs);
  const auto printed = test::run_python("reference_onnx.py", quoted(model_path) + " " + quoted(in) + " " + quoted(out));
  return {nlohmann::json::parse(printed), safetensors::read(out)};
}

std::vector<std::string> folder_entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

// onnxruntime's outputs for input `key` against the model's forward pass on x: logits (or features) within 1e-4,
// every block's attention probabilities (and a MAP head's) within 1e-5; the differences printed after `label`.
void expect_matches_model(VisionTransformer& net, const torch::Tensor& x, const Reference& reference,
                          const std::string& key, const std::string& label) {
  const auto& m = net->config();
  const std::string output = m.num_classes > 0 ? "logits" : "features";
  torch::NoGradGuard no_grad;
  Capture capture;
  capture.attention = true;
  // (B, K), or (B, D) pooled features without a head
  const auto expected = net->forward_head(net->forward_features(x, {}, &capture), false, &capture);
  const auto got = reference.outputs.tensor(key + "/" + output);
  ASSERT_EQ(got.sizes(), expected.sizes()) << key;
  const double logits = max_abs_diff(got, expected);
  double attention = 0.0;
  for (int64_t b = 0; b < m.depth; ++b) {
    const auto probs = reference.outputs.tensor(key + "/attention." + std::to_string(b));
    ASSERT_EQ(probs.sizes(), capture.attention_probs[b].sizes()) << key << " attention." << b;
    attention = std::max(attention, max_abs_diff(probs, capture.attention_probs[b]));
  }
  if (m.global_pool == GlobalPool::map) {
    attention = std::max(attention, max_abs_diff(reference.outputs.tensor(key + "/pool_attention"),
                                                 capture.pool_attention));
  }
  std::cout << label << ": max |d| " << output << " " << logits << ", attention " << attention << "\n";
  EXPECT_LE(logits, 1e-4) << key;
  EXPECT_LE(attention, 1e-5) << key;
}

class OnnxParity : public ::testing::TestWithParam<Variant> {};

TEST_P(OnnxParity, LogitsAndAttentionMatchOnnxruntime) {
  SKIP_WITHOUT_PYTHON("onnx", "onnxruntime", "safetensors", "numpy");
  const auto& variant = GetParam();
  const auto& m = variant.model;
  auto net = random_model(m);
  test::TempDir dir;
  const std::string path = dir / "model.onnx";
  onnx::write_onnx(export_input(net, /*attention_outputs=*/true), path);

  torch::manual_seed(1);
  const safetensors::NamedTensors inputs{{"batch1", torch::randn({1, m.in_chans, m.img_h, m.img_w})},
                                         {"batch3", torch::randn({3, m.in_chans, m.img_h, m.img_w})}};
  const auto reference = run_reference(path, dir, inputs);
  const std::string output = m.num_classes > 0 ? "logits" : "features";
  const int64_t tokens = m.grid_h() * m.grid_w() + m.num_prefix_tokens();
  const bool map_head = m.global_pool == GlobalPool::map;
  const auto& outputs = reference.info["outputs"];
  ASSERT_EQ(outputs.size(), static_cast<size_t>(1 + m.depth + (map_head ? 1 : 0))) << outputs.dump();
  EXPECT_EQ(outputs[0]["name"], output);
  EXPECT_EQ(outputs[0]["shape"].dump(),
            nlohmann::json({"batch", m.num_classes > 0 ? m.num_classes : m.embed_dim}).dump());
  for (int64_t b = 0; b < m.depth; ++b) {
    EXPECT_EQ(outputs[1 + b]["name"], "attention." + std::to_string(b));
    EXPECT_EQ(outputs[1 + b]["shape"].dump(), nlohmann::json({"batch", m.num_heads, tokens, tokens}).dump());
  }
  if (map_head) {
    EXPECT_EQ(outputs[1 + m.depth]["name"], "pool_attention");
    EXPECT_EQ(outputs[1 + m.depth]["shape"].dump(),
              nlohmann::json({"batch", m.pool_heads(), 1,
                              m.grid_h() * m.grid_w() + (m.pool_includes_prefix() ? m.num_prefix_tokens() : 0)})
                  .dump());
  }

  for (const auto& [key, x] : inputs) expect_matches_model(net, x, reference, key, variant.name + " " + key);
}

INSTANTIATE_TEST_SUITE_P(Onnx, OnnxParity, ::testing::ValuesIn(variants()),
                         [](const ::testing::TestParamInfo<Variant>& info) { return info.param.name; });

TEST(Onnx, NamesBatchDimAndMetadataInOrder) {
  SKIP_WITHOUT_PYTHON("onnx", "onnxruntime", "safetensors", "numpy");
  const auto m = variants()[0].model;
  auto net = random_model(m);
  auto input = export_input(net, /*attention_outputs=*/false);
  // Not sorted, so that an ordered map anywhere on the way would show.
  input.metadata = {{"vit.config", R"({"model": {"depth": 2}})"}, {"b", "2"}, {"a", "1"}};
  test::TempDir dir;
  const std::string path = dir / "model.onnx";
  onnx::write_onnx(input, path);
  EXPECT_EQ(folder_entries(dir.path()), std::vector<std::string>{"model.onnx"}) << "temp file left behind";

  torch::manual_seed(1);
  const auto x = torch::randn({2, m.in_chans, m.img_h, m.img_w});
  const auto reference = run_reference(path, dir, {{"batch2", x}});
  const auto& info = reference.info;
  EXPECT_EQ(info["metadata_props"].dump(),
            nlohmann::json::array({nlohmann::json::array({"vit.config", R"({"model": {"depth": 2}})"}),
                                   nlohmann::json::array({"b", "2"}), nlohmann::json::array({"a", "1"})})
                .dump());
  EXPECT_EQ(info["ir_version"], 8);
  EXPECT_EQ(info["opsets"].dump(), R"({"":17})");
  EXPECT_EQ(info["producer"].dump(), nlohmann::json({"vit", VIT_VERSION}).dump());
  ASSERT_EQ(info["inputs"].size(), 1u) << info["inputs"].dump() << " (initializers must not be graph inputs)";
  EXPECT_EQ(info["inputs"][0]["name"], "pixel_values");
  EXPECT_EQ(info["inputs"][0]["shape"].dump(), nlohmann::json({"batch", m.in_chans, m.img_h, m.img_w}).dump());
  ASSERT_EQ(info["outputs"].size(), 1u) << info["outputs"].dump();
  EXPECT_EQ(info["outputs"][0]["name"], "logits");
  EXPECT_EQ(info["outputs"][0]["shape"].dump(), nlohmann::json({"batch", m.num_classes}).dump());

  torch::NoGradGuard no_grad;
  const double logits = max_abs_diff(reference.outputs.tensor("batch2/logits"), net->forward(x));
  std::cout << "without attention outputs, batch 2: max |d| logits " << logits << "\n";
  EXPECT_LE(logits, 1e-4);
}

// --dynamic-size: one file, run by onnxruntime at the trained size, a larger one and a rectangular smaller one, gives
// what the model gives at each (it resamples its position embedding per grid, as `vit predict --img-size` does).
struct SizedVariant {
  std::string name;
  ModelConfig model;
  std::vector<std::pair<int64_t, int64_t>> sizes;  // H x W to run at, the trained one first
};
void PrintTo(const SizedVariant& variant, std::ostream* out) { *out << variant.name; }

std::vector<SizedVariant> sized_variants() {
  const auto all = variants();
  auto find = [&](const std::string& name) {
    for (const auto& v : all) {
      if (v.name == name) return v.model;
    }
    throw std::logic_error("no variant " + name);
  };
  const std::vector<std::pair<int64_t, int64_t>> square{{16, 16}, {24, 24}, {8, 20}};
  std::vector<SizedVariant> list{{"token", find("token"), square},
                                 {"avg_no_class_token", find("avg_no_class_token"), square},
                                 {"no_embed_class", find("no_embed_class"), square},
                                 {"reg_tokens_pos_embed_no_head", find("reg_tokens_pos_embed_no_head"), square},
                                 {"map_reg_tokens_qk_norm", find("map_reg_tokens_qk_norm"), square}};
  auto rect = find("token");
  rect.img_w = 24;
  rect.patch_size = 8;
  list.push_back({"rect_16x24_patch8", rect, {{16, 24}, {32, 32}, {8, 16}}});
  // Rotary embeddings computed in the graph for each input's grid: EVA-02's cat over a reference grid (beside a
  // resampled pos_embed), RoPE-ViT mixed in xy order, DINOv3's normalised centres trained on a rectangle.
  list.push_back({"eva02_rope_swiglu", find("eva02_rope_swiglu"), square});
  list.push_back({"eva_rope_mixed_map", find("eva_rope_mixed_map"), square});
  list.push_back({"dinov3_rope", find("dinov3_rope"), {{16, 24}, {32, 20}, {8, 8}}});
  list.push_back({"aimv2_rmsnorm_swiglu", find("aimv2_rmsnorm_swiglu"), square});
  list.push_back({"sapiens2_grouped_query", find("sapiens2_grouped_query"), square});
  return list;
}

class OnnxDynamicSize : public ::testing::TestWithParam<SizedVariant> {};

TEST_P(OnnxDynamicSize, MatchesTheModelAtThreeSizes) {
  SKIP_WITHOUT_PYTHON("onnx", "onnxruntime", "safetensors", "numpy");
  const auto& variant = GetParam();
  const auto& m = variant.model;
  auto net = random_model(m);
  test::TempDir dir;
  const std::string path = dir / "model.onnx";
  auto input = export_input(net, /*attention_outputs=*/true);
  input.dynamic_size = true;
  EXPECT_EQ(onnx::write_onnx(input, path), std::vector<std::string>{path});

  torch::manual_seed(1);
  safetensors::NamedTensors inputs;
  for (const auto& [h, w] : variant.sizes) {
    inputs.emplace_back(std::to_string(h) + "x" + std::to_string(w), torch::randn({2, m.in_chans, h, w}));
  }
  const auto reference = run_reference(path, dir, inputs);
  const auto& info = reference.info;
  EXPECT_EQ(info["opsets"].dump(), R"({"":18})");
  EXPECT_EQ(info["inputs"][0]["shape"].dump(), nlohmann::json({"batch", m.in_chans, "height", "width"}).dump());
  EXPECT_EQ(info["outputs"][1]["shape"].dump(), nlohmann::json({"batch", m.num_heads, "tokens", "tokens"}).dump());
  for (const auto& [key, x] : inputs) expect_matches_model(net, x, reference, key, variant.name + " at " + key);
}

INSTANTIATE_TEST_SUITE_P(Onnx, OnnxDynamicSize, ::testing::ValuesIn(sized_variants()),
                         [](const ::testing::TestParamInfo<SizedVariant>& info) { return info.param.name; });

// --external-data: the weights in model.onnx.data beside a small graph, offsets aligned, read back by onnxruntime;
// models past protobuf's 2 GiB get it unasked (OnnxLarge below, outside the default set).
TEST(Onnx, ExternalDataBesideTheGraph) {
  SKIP_WITHOUT_PYTHON("onnx", "onnxruntime", "safetensors", "numpy");
  const auto m = variants()[0].model;
  auto net = random_model(m);
  auto input = export_input(net, /*attention_outputs=*/false);
  input.external_data = true;
  test::TempDir dir;
  const std::string path = dir / "model.onnx";
  EXPECT_EQ(onnx::write_onnx(input, path), (std::vector<std::string>{path, path + ".data"}));  // what it wrote
  EXPECT_EQ(folder_entries(dir.path()), (std::vector<std::string>{"model.onnx", "model.onnx.data"}));
  const auto graph_bytes = std::filesystem::file_size(path);
  const auto data_bytes = std::filesystem::file_size(onnx::external_data_path(path));
  std::cout << "external data: graph " << graph_bytes << " bytes, weights " << data_bytes << " bytes\n";
  EXPECT_LT(graph_bytes, 16u * 1024u) << "the large weights stayed in the graph";
  EXPECT_GT(data_bytes, static_cast<uintmax_t>(count_parameters(*net)) * 3);  // most of the float32 weights

  torch::manual_seed(1);
  const auto x = torch::randn({2, m.in_chans, m.img_h, m.img_w});
  const auto reference = run_reference(path, dir, {{"batch2", x}});
  torch::NoGradGuard no_grad;
  const double logits = max_abs_diff(reference.outputs.tensor("batch2/logits"), net->forward(x));
  std::cout << "external data, batch 2: max |d| logits " << logits << "\n";
  EXPECT_LE(logits, 1e-4);

  EXPECT_FALSE(onnx::needs_external_data(uint64_t{1} << 30));
  EXPECT_TRUE(onnx::needs_external_data(uint64_t{2530} * 1000 * 1000));  // ViT-H/14: 632M float32 parameters
}

// A model over protobuf's 2 GiB: ViT-H/14 (632M parameters, 2.5 GB in float32) with random weights goes to
// model.onnx + model.onnx.data unasked, and onnxruntime loads and runs it with our logits. Minutes and ~12 GB of
// memory, so outside the default set: VIT_LARGE_TESTS=1 runs it (README, "The test suite and CI").
TEST(OnnxLarge, VitHugeGoesToExternalDataThatOnnxruntimeRuns) {
  const char* wanted = std::getenv("VIT_LARGE_TESTS");
  if (wanted == nullptr || std::string(wanted) != "1") GTEST_SKIP() << "a large test: VIT_LARGE_TESTS=1 runs it";
  SKIP_WITHOUT_PYTHON("onnx", "onnxruntime", "safetensors", "numpy");
  ModelConfig m = test::tiny_vit(/*img=*/224, /*patch=*/14, /*in_chans=*/3, /*num_classes=*/1000,
                                 /*embed_dim=*/1280, /*depth=*/32, /*num_heads=*/16, /*mlp_ratio=*/4.0);
  torch::manual_seed(0);
  VisionTransformer net(m, Init::none);
  net->eval();
  {
    torch::NoGradGuard no_grad;
    for (auto& p : net->parameters()) p.normal_(0.0, 0.02);
  }
  test::TempDir dir;
  const std::string path = dir / "model.onnx";
  {
    auto input = export_input(net, /*attention_outputs=*/false);
    uint64_t bytes = 0;
    for (const auto& [name, weight] : input.weights) bytes += weight.data.size() * sizeof(float);
    std::cout << "ViT-H/14: " << count_parameters(*net) << " parameters, " << bytes << " bytes of weights\n";
    ASSERT_TRUE(onnx::needs_external_data(bytes));
    onnx::write_onnx(input, path);  // external_data not asked for
  }
  EXPECT_EQ(folder_entries(dir.path()), (std::vector<std::string>{"model.onnx", "model.onnx.data"}));
  EXPECT_GT(std::filesystem::file_size(onnx::external_data_path(path)), uintmax_t{1} << 31);

  torch::manual_seed(1);
  const auto x = torch::randn({1, 3, 224, 224});
  const auto reference = run_reference(path, dir, {{"image", x}});
  torch::NoGradGuard no_grad;
  const double logits = max_abs_diff(reference.outputs.tensor("image/logits"), net->forward(x));
  std::cout << "ViT-H/14 through external data: max |d| logits " << logits << "\n";
  EXPECT_LE(logits, 1e-4);
}

TEST(Onnx, MissingFolderFailsNamingItAndLeavesNothing) {
  auto net = random_model(variants()[0].model);
  test::TempDir dir;
  const std::string path = dir / "no_such_folder/model.onnx";
  const auto error = test::error_of([&] { onnx::write_onnx(export_input(net, false), path); });
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_NE(error.find("No such file or directory"), std::string::npos) << error;
  EXPECT_TRUE(folder_entries(dir.path()).empty());
}

TEST(Onnx, UnrepresentableInputsThrowNamingThem) {
  const auto m = variants()[0].model;
  auto net = random_model(m);
  test::TempDir dir;
  const std::string path = dir / "model.onnx";
  auto write = [&](const onnx::ExportInput& input) { return test::error_of([&] { onnx::write_onnx(input, path); }); };

  auto extra = export_input(net, false);
  extra.weights["blocks.0.attn.q_norm.weight"] = {{8}, std::vector<float>(8, 1.0f)};  // timm's qk_norm
  auto error = write(extra);
  EXPECT_NE(error.find(path + ": weight 'blocks.0.attn.q_norm.weight' [8] has no place"), std::string::npos) << error;

  auto missing = export_input(net, false);
  missing.weights.erase("blocks.1.mlp.fc2.bias");
  error = write(missing);
  EXPECT_NE(error.find("missing weight 'blocks.1.mlp.fc2.bias' [32]"), std::string::npos) << error;

  auto reshaped = export_input(net, false);
  reshaped.weights["pos_embed"].shape = {1, 16, 34};
  error = write(reshaped);
  EXPECT_NE(error.find("weight 'pos_embed' has shape [1, 16, 34], the model config expects [1, 17, 32]"),
            std::string::npos)
      << error;

  auto token_without_class = export_input(net, false);
  token_without_class.model.class_token = false;
  error = write(token_without_class);
  EXPECT_NE(error.find("model.global_pool \"token\" needs class_token true"), std::string::npos) << error;

  auto relative = random_model(variants()[4].model);  // rel_pos_bias
  auto dynamic = export_input(relative, false);
  dynamic.dynamic_size = true;
  error = write(dynamic);
  EXPECT_NE(error.find(path + ": a dynamic input size cannot hold the relative position bias"), std::string::npos)
      << error;

  auto repeated = export_input(net, false);
  repeated.metadata = {{"a", "1"}, {"a", "2"}};
  error = write(repeated);
  EXPECT_NE(error.find(path + ": metadata key 'a' given twice"), std::string::npos) << error;

  EXPECT_TRUE(folder_entries(dir.path()).empty()) << "a failed write left a file";
}

#else

TEST(Onnx, Skipped) {
  GTEST_SKIP() << "built with VIT_WITH_ONNX=OFF (protobuf or libonnx-dev not found): no ONNX writer to test";
}

#endif

}  // namespace
}  // namespace vit
