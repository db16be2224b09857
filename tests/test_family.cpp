// The timm ViT family (model_config.h: reg_tokens, no_embed_class, pre_norm, qk_norm, act_layer, final_norm, fc_norm,
// global_pool "map"), against timm from PyPI: random-initialised small versions of each architecture, saved by
// timm's save_for_hf and loaded here with no config, give timm's logits within 1e-4 and its attention within 1e-5,
// at the trained size and (with timm's dynamic_img_size) at another one; every preset has the state-dict shapes,
// LayerNorm epsilon, activation, input size and prefix tokens of timm's model of that name. References come from
// tests/reference_family.py, run by the project's reference Python (skips with the reason where it is missing).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "config/timm_architectures.h"
#include "io/model_file.h"
#include "io/safetensors.h"
#include "model/flops.h"
#include "test_util.h"
#include "util/fs.h"

namespace vit {
namespace {

using test::max_abs_diff;
using test::run_python;
using test::TempDir;

constexpr double kLogitTolerance = 1e-4;
constexpr double kAttentionTolerance = 1e-5;

struct FamilyCase {
  std::string name, arch, args, sizes;  // sizes: "HxW,..." (the first is the trained size)
  std::string resample = "";            // "HxW": also load the folder for fine-tuning at that img_size
};

void PrintTo(const FamilyCase& c, std::ostream* os) { *os << c.name << " (" << c.arch << ")"; }

class TimmFamily : public ::testing::TestWithParam<FamilyCase> {};

TEST_P(TimmFamily, LoadsWithNoConfigAndMatchesTimm) {
  SKIP_WITHOUT_PYTHON("timm", "safetensors");
  const auto& c = GetParam();
  TempDir dir;
  const std::string snap = dir / "snapshot", ref = dir / "ref.safetensors";
  run_python("reference_family.py", "snapshot " + test::quoted(snap) + " --arch " + c.arch + " --args " +
                                        test::quoted(c.args) + " --sizes " + c.sizes + " --ref " + test::quoted(ref) +
                                        (c.resample.empty() ? "" : " --resample " + c.resample));
  auto model = load_model(snap);
  model.net->eval();
  const auto expected = safetensors::read(ref);
  EXPECT_EQ(count_parameters(*model.net), expected.tensor("num_params").item<int64_t>());
  // vit info's table counts every parameter.
  int64_t counted = 0;
  for (const auto& cost : layer_costs(model.config())) counted += cost.params;
  EXPECT_EQ(counted, count_parameters(*model.net));

  torch::NoGradGuard no_grad;
  for (int i = 0;; ++i) {
    const std::string at = std::to_string(i);
    if (expected.find("pixels." + at) == nullptr) break;
    const auto pixels = expected.tensor("pixels." + at);
    const auto logits = model.net->forward(pixels);  // the default path (fused attention where the build has it)
    Capture capture;
    capture.attention = true;
    const auto explicit_logits = model.net->forward_head(model.net->forward_features(pixels, {}, &capture), false,
                                                         &capture);
    const double logit_diff = max_abs_diff(logits, expected.tensor("logits." + at));
    const double explicit_diff = max_abs_diff(explicit_logits, expected.tensor("logits." + at));
    double attention_diff = 0;
    ASSERT_EQ(static_cast<int64_t>(capture.attention_probs.size()), model.config().depth);
    for (size_t b = 0; b < capture.attention_probs.size(); ++b) {
      attention_diff = std::max(attention_diff, max_abs_diff(capture.attention_probs[b],
                                                             expected.tensor("attn." + at + "." + std::to_string(b))));
    }
    const bool map_head = expected.find("pool." + at) != nullptr;
    EXPECT_EQ(map_head, model.config().global_pool == GlobalPool::map);
    const double pool_diff = map_head ? max_abs_diff(capture.pool_attention, expected.tensor("pool." + at)) : 0.0;
    std::cout << c.name << " at " << pixels.size(2) << "x" << pixels.size(3) << ": max |d| logits " << logit_diff
              << " (explicit attention " << explicit_diff << "), attention " << attention_diff
              << (map_head ? ", pooling attention " : "");
    if (map_head) std::cout << pool_diff;
    std::cout << "\n";
    EXPECT_LE(logit_diff, kLogitTolerance);
    EXPECT_LE(explicit_diff, kLogitTolerance);
    EXPECT_LE(attention_diff, kAttentionTolerance);
    EXPECT_LE(pool_diff, kAttentionTolerance);
  }
  if (!c.resample.empty()) {
    // train --init-from at another size: the position embedding resampled as timm's checkpoint filter does it
    // (bicubic, antialiased, prefix rows kept apart unless no_embed_class).
    ModelConfig bigger = model.config();
    bigger.img_h = std::stoll(c.resample.substr(0, c.resample.find('x')));
    bigger.img_w = std::stoll(c.resample.substr(c.resample.find('x') + 1));
    VisionTransformer net(bigger);
    const auto adapted = load_for_finetune(snap, net);
    ASSERT_EQ(adapted.size(), 1u);
    EXPECT_NE(adapted[0].find("pos_embed resampled"), std::string::npos) << adapted[0];
    const double diff = max_abs_diff(net->pos_embed, expected.tensor("resampled_pos_embed"));
    std::cout << c.name << ": pos_embed resampled to " << c.resample << ", max |d| " << diff << "\n";
    EXPECT_LE(diff, 1e-6);
  }
}

// Each option of the family at least once, tiny (2 blocks, width 64); the second size runs through timm's
// dynamic_img_size (bicubic, antialiased resampling of the position embedding, prefix rows kept).
constexpr const char* kTiny = R"("depth": 2, "embed_dim": 64, "num_heads": 4, "num_classes": 5)";
std::string tiny(const std::string& extra) { return std::string("{") + kTiny + ", " + extra + "}"; }

INSTANTIATE_TEST_SUITE_P(
    Architectures, TimmFamily,
    ::testing::Values(
        // no_embed_class + LayerScale.
        FamilyCase{"deit3", "deit3_small_patch16_224", tiny(R"("img_size": 32, "dynamic_img_size": true)"),
                   "32x32,48x64", "64x48"},
        // Patch 14, LayerScale, position embedding interpolated to another grid.
        FamilyCase{"dinov2", "vit_small_patch14_dinov2", tiny(R"("img_size": 56, "dynamic_img_size": true)"),
                   "56x56,70x42"},
        // Register tokens with no_embed_class; no head (features out), as the published DINOv2.
        FamilyCase{"dinov2_reg4", "vit_small_patch14_reg4_dinov2",
                   R"({"depth": 2, "embed_dim": 64, "num_heads": 4, "num_classes": 0, "img_size": 56,
                       "dynamic_img_size": true})",
                   "56x56,84x56", "28x42"},
        // pre_norm (norm_pre, no patch bias), LayerNorm eps 1e-5 from the architecture.
        FamilyCase{"clip_b16", "vit_base_patch16_clip_224", tiny(R"("img_size": 32, "dynamic_img_size": true)"),
                   "32x32,48x48"},
        FamilyCase{"clip_b32", "vit_base_patch32_clip_224", tiny(R"("img_size": 64)"), "64x64"},
        // OpenAI CLIP's quick_gelu.
        FamilyCase{"clip_quickgelu", "vit_base_patch16_clip_quickgelu_224", tiny(R"("img_size": 32)"), "32x32"},
        // MAP head without a class token.
        FamilyCase{"siglip", "vit_base_patch16_siglip_224", tiny(R"("img_size": 32, "dynamic_img_size": true)"),
                   "32x32,48x32", "64x64"},
        // MAP head with gelu_tanh.
        FamilyCase{"siglip_tanh", "vit_base_patch32_siglip_256", tiny(R"("img_size": 64)"), "64x64"},
        // MAP head over the patches only, behind register tokens.
        FamilyCase{"reg4_map", "vit_so150m_patch16_reg4_map_256", tiny(R"("img_size": 32)"), "32x32"},
        // No class token, register tokens, average pooling, no_embed_class.
        FamilyCase{"reg4_gap", "vit_medium_patch16_reg4_gap_256", tiny(R"("img_size": 32, "dynamic_img_size": true)"),
                   "32x32,48x48", "48x48"},
        // Average pooling with fc_norm false (the final norm on every token).
        FamilyCase{"gap_no_fc_norm", "vit_base_patch16_gap_224", tiny(R"("img_size": 32)"), "32x32"},
        // final_norm false with register tokens (RADIO).
        FamilyCase{"no_final_norm", "vit_base_patch16_radio_v3", tiny(R"("img_size": 32)"), "32x32"},
        // qk_norm on a plain ViT.
        FamilyCase{"qk_norm", "vit_small_patch16_224",
                   tiny(R"("img_size": 32, "qk_norm": true, "dynamic_img_size": true)"), "32x32,32x48", "80x48"},
        // timm's Eva class, each family at its trained size and two others (one rectangular).
        // EVA-02: rotary embeddings (cat) rescaled to ref_feat_shape, packed SwiGLU, q_bias / v_bias, avg + fc_norm.
        FamilyCase{"eva02", "eva02_tiny_patch14_224", tiny(R"("img_size": 28, "dynamic_img_size": true)"),
                   "28x28,42x56,56x56", "42x42"},
        // EVA-02 CLIP: q_proj / k_proj / v_proj, SwiGLU as fc1_g / fc1_x with mlp.norm, attn.norm, class token.
        FamilyCase{"eva02_clip", "eva02_base_patch16_clip_224", tiny(R"("img_size": 32, "dynamic_img_size": true)"),
                   "32x32,48x32,64x64"},
        // DINOv3: DINOv3 rotary periods over normalised patch centres, rotate_half, 4 registers, gamma_1 / gamma_2,
        // no learned position embedding, with and without qkv bias.
        FamilyCase{"dinov3", "vit_small_patch16_dinov3", tiny(R"("img_size": 32)"), "32x32,48x64,80x80"},
        // ... and with class-token pooling, as upstream DINOv3 (model_args' global_pool over the architecture's).
        FamilyCase{"dinov3_qkvb", "vit_small_patch16_dinov3_qkvb", tiny(R"("img_size": 32, "global_pool": "token")"),
                   "32x32,64x48,48x48"},
        // RoPE-ViT: axial (cat, xy, temperature 100), mixed (learned frequencies per block and head), axial with APE.
        FamilyCase{"rope_axial", "vit_small_patch16_rope_224", tiny(R"("img_size": 32, "dynamic_img_size": true)"),
                   "32x32,48x64,64x64"},
        FamilyCase{"rope_mixed", "vit_small_patch16_rope_mixed_224",
                   tiny(R"("img_size": 32, "dynamic_img_size": true)"), "32x32,64x48,48x48"},
        FamilyCase{"rope_ape", "vit_small_patch16_rope_ape_224", tiny(R"("img_size": 32, "dynamic_img_size": true)"),
                   "32x32,48x64,64x64"},
        // timm's rope_reg gap: one register, no class token, average pooling; model_args' use_fc_norm false puts the
        // final norm on every token (use_post_transformer_norm's default then).
        FamilyCase{"rope_reg1_gap", "vit_medium_patch16_rope_reg1_gap_256",
                   tiny(R"("img_size": 32, "dynamic_img_size": true, "use_fc_norm": false)"), "32x32,48x32,64x64"},
        // Perception Encoder core: norm_pre, grid offset 1, MAP head with its own 8 heads; spatial: no final norm.
        FamilyCase{"pe_core", "vit_pe_core_tiny_patch16_384", tiny(R"("img_size": 32, "dynamic_img_size": true)"),
                   "32x32,64x48,48x48"},
        FamilyCase{"pe_spatial", "vit_pe_spatial_tiny_patch16_512", tiny(R"("img_size": 32, "dynamic_img_size": true)"),
                   "32x32,48x64,64x64"},
        // AIMv2 (timm's VisionTransformer): RmsNorm everywhere and on the patch embedding (eps 1e-5 from the
        // architecture), SwiGLU as fc1_g / fc1_x with SiLU, no qkv or projection biases, average pooling over the
        // norm on every token.
        FamilyCase{"aimv2", "aimv2_large_patch14_224", tiny(R"("img_size": 28, "dynamic_img_size": true)"),
                   "28x28,42x56,56x56", "42x42"},
        // DINOv2 giant: SwiGLUPacked (one fc1 of int(D x mlp_ratio) rows, gates first) with SiLU, LayerScale; the
        // width is tiny's, even as SwiGLUPacked needs.
        FamilyCase{"dinov2_giant", "vit_giant_patch14_reg4_dinov2",
                   tiny(R"("img_size": 28, "dynamic_img_size": true, "mlp_ratio": 5.3125)"), "28x28,56x42,42x42"},
        // BEiT-3 (timm's VisionTransformer): scale_attn_norm and scale_mlp_norm (attn.norm, mlp.norm), LayerNorm eps
        // 1e-5, average pooling beside a class token.
        FamilyCase{"beit3", "beit3_base_patch16_224", tiny(R"("img_size": 32, "dynamic_img_size": true)"),
                   "32x32,48x64,64x64"},
        // EVA-02 CLIP enormous: residual post-norm blocks (x + norm1(attn(x))), class token.
        FamilyCase{"eva02_post_norm", "eva02_enormous_patch14_clip_224",
                   tiny(R"("img_size": 28, "dynamic_img_size": true)"), "28x28,42x56,56x56"},
        // Sapiens2: grouped-query attention in the second block (2 key/value heads for 4), AttentionRope's three
        // biases, qk_norm, RmsNorm, 8 registers, DINOv3 rotary (its training-time rescaling off in evaluation).
        FamilyCase{"sapiens2", "vit_base_patch16_sapiens2",
                   tiny(R"("img_size": [32, 48], "dynamic_img_size": true, "num_kv_heads": [4, 2])"),
                   "32x48,48x32,64x64"}),
    [](const auto& info) { return info.param.name; });

// DINOv3 in transformers' own layout (DINOv3ViTModel.save_pretrained): a random two-block model, every weight
// perturbed, loads with no config as timm's Eva and gives transformers' pooler output within 1e-4 and every block's
// attention within 1e-5, at its size and others (one rectangular): DINOv3's query and value biases with a GELU
// MLP, all three biases with the gated (SwiGLU) MLP, and no bias at all (proj_bias and mlp_bias false).
struct Dinov3Case {
  std::string name, args, sizes;
};
void PrintTo(const Dinov3Case& c, std::ostream* os) { *os << c.name; }
class HfDinov3 : public ::testing::TestWithParam<Dinov3Case> {};

TEST_P(HfDinov3, LoadsWithNoConfigAndMatchesTransformers) {
  SKIP_WITHOUT_PYTHON("transformers", "safetensors");
  const auto& c = GetParam();
  TempDir dir;
  const std::string snap = dir / "snapshot", ref = dir / "ref.safetensors";
  run_python("reference_family.py", "dinov3-hf " + test::quoted(snap) + " --args " + test::quoted(c.args) +
                                        " --sizes " + c.sizes + " --ref " + test::quoted(ref));
  auto model = load_model(snap);
  model.net->eval();
  EXPECT_EQ(model.config().model_class, ModelClass::eva);
  const auto expected = safetensors::read(ref);
  torch::NoGradGuard no_grad;
  for (int i = 0;; ++i) {
    const std::string at = std::to_string(i);
    if (expected.find("pixels." + at) == nullptr) break;
    const auto pixels = expected.tensor("pixels." + at);
    Capture capture;
    capture.attention = true;
    const auto features = model.net->forward_head(model.net->forward_features(pixels, {}, &capture), false, &capture);
    const double feature_diff = max_abs_diff(model.net->forward(pixels), expected.tensor("logits." + at));
    const double explicit_diff = max_abs_diff(features, expected.tensor("logits." + at));
    double attention_diff = 0;
    for (size_t b = 0; b < capture.attention_probs.size(); ++b) {
      attention_diff = std::max(attention_diff, max_abs_diff(capture.attention_probs[b],
                                                             expected.tensor("attn." + at + "." + std::to_string(b))));
    }
    std::cout << "hf " << c.name << " at " << pixels.size(2) << "x" << pixels.size(3) << ": max |d| features "
              << feature_diff << " (explicit attention " << explicit_diff << "), attention " << attention_diff << "\n";
    EXPECT_LE(feature_diff, kLogitTolerance);
    EXPECT_LE(explicit_diff, kLogitTolerance);
    EXPECT_LE(attention_diff, kAttentionTolerance);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, HfDinov3,
    ::testing::Values(
        Dinov3Case{"dinov3_mlp",
                   R"({"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "num_register_tokens": 4, "image_size": 32})",
                   "32x32,48x64,80x80"},
        Dinov3Case{"dinov3_gated_key_bias",
                   R"({"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "num_register_tokens": 2, "image_size": 32, "use_gated_mlp": true, "hidden_act": "silu",
                       "key_bias": true, "layer_norm_eps": 1e-6, "rope_theta": 50.0})",
                   "32x32,64x48,48x48"},
        Dinov3Case{"dinov3_no_biases",
                   R"({"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "image_size": 32, "use_gated_mlp": true, "hidden_act": "silu", "query_bias": false,
                       "value_bias": false, "proj_bias": false, "mlp_bias": false})",
                   "32x32,48x32"}),
    [](const auto& info) { return info.param.name; });

TEST(TimmPresets, EveryPresetHasTimmsShapesNormsActivationAndSize) {
  SKIP_WITHOUT_PYTHON("timm");
  TempDir dir;
  {
    std::ofstream names(dir / "names.txt");
    // At depth 1 a per-block num_kv_heads becomes its grouped value (the fewest heads), for timm as here.
    for (const auto& arch : kTimmArchitectures) {
      const auto kv = model_preset(arch.name).num_kv_heads;
      names << arch.name;
      if (kv.size() > 1) names << " " << *std::min_element(kv.begin(), kv.end());
      names << "\n";
    }
  }
  run_python("reference_family.py", "shapes " + test::quoted(dir / "names.txt") + " --out " +
                                        test::quoted(dir / "shapes.json"));
  const auto timm = nlohmann::json::parse(read_file(dir / "shapes.json"));
  int checked = 0;
  for (const auto& arch : kTimmArchitectures) {
    SCOPED_TRACE(arch.name);
    ASSERT_TRUE(timm.contains(arch.name));
    const auto& theirs = timm[arch.name];
    ModelConfig m = model_preset(arch.name);
    m.depth = 1;
    if (m.num_kv_heads.size() > 1) m.num_kv_heads = {*std::min_element(m.num_kv_heads.begin(), m.num_kv_heads.end())};
    const auto& state = theirs["state"];
    m.num_classes = state.contains("head.weight") ? state["head.weight"][0].get<int64_t>() : 0;
    EXPECT_EQ(theirs["img_size"], nlohmann::json::array({m.img_h, m.img_w}));
    EXPECT_EQ(theirs["num_prefix_tokens"].get<int64_t>(), m.num_prefix_tokens());
    EXPECT_EQ(theirs["act"].get<std::string>(), name_of(m.gate_activation()));  // SwiGLU: the gate's
    EXPECT_EQ(theirs["eps"], nlohmann::json::array({m.layer_norm_eps}));
    std::set<std::string> norms{name_of(m.norm_layer)};
    if (m.embed_norm_layer) norms.insert(name_of(*m.embed_norm_layer));
    EXPECT_EQ(theirs["norms"].get<std::set<std::string>>(), norms);
    VisionTransformer net(m, Init::none);
    std::map<std::string, std::vector<int64_t>> ours;
    for (const auto& [name, tensor] : state_tensors(net)) ours[name] = tensor.sizes().vec();
    std::map<std::string, std::vector<int64_t>> expected;
    for (const auto& [name, shape] : state.items()) expected[name] = shape.get<std::vector<int64_t>>();
    EXPECT_EQ(ours, expected);
    ++checked;
  }
  std::cout << "checked " << checked << " timm architectures\n";
  EXPECT_GE(checked, 100);
}

// The rotary grid's training-time augmentations (rope_shift_coords, rope_jitter_coords, rope_rescale_coords, timm's
// _apply_coord_augs): in training one shift per axis within [-s, s], one scale per axis within [1/j, j] and one shared
// scale within [1/r, r], drawn anew each time; in evaluation the coordinates and the table are the plain ones.
TEST(RotaryAugmentation, ShiftsAndScalesTheGridInTrainingOnly) {
  ModelConfig m;
  m.model_class = ModelClass::eva, m.embed_dim = 64, m.num_heads = 4, m.use_rot_pos_emb = true;
  m.use_abs_pos_emb = false, m.rope_type = RopeType::dinov3, m.rope_temperature = 100.0;
  const ModelConfig plain = m;
  const auto coords = torch::rand({12, 2}) * 2 - 1;  // (Np, 2)
  auto check = [&](void (*set)(ModelConfig&), const char* what) {
    SCOPED_TRACE(what);
    ModelConfig augmented = m;
    set(augmented);
    RotaryEmbedding rope(augmented), reference(plain);
    rope->eval();
    EXPECT_TRUE(torch::equal(rope->augment(coords), coords));
    EXPECT_TRUE(torch::equal(rope->embed({3, 4}), reference->embed({3, 4})));
    rope->train();
    const auto once = rope->augment(coords), twice = rope->augment(coords);
    EXPECT_FALSE(torch::equal(once, twice)) << "one draw per call";
    return once;
  };
  const auto shifted = check([](ModelConfig& c) { c.rope_shift_coords = 0.5; }, "shift") - coords;  // (Np, 2)
  EXPECT_LT((shifted - shifted[0]).abs().max().item<double>(), 1e-6) << "one shift per axis for every position";
  EXPECT_LE(shifted.abs().max().item<double>(), 0.5 + 1e-6);
  const auto jittered = check([](ModelConfig& c) { c.rope_jitter_coords = 1.5; }, "jitter") / coords;
  EXPECT_LT((jittered - jittered[0]).abs().max().item<double>(), 1e-4) << "one scale per axis";
  EXPECT_GE(jittered.min().item<double>(), 1 / 1.5 - 1e-6);
  EXPECT_LE(jittered.max().item<double>(), 1.5 + 1e-6);
  const auto rescaled = check([](ModelConfig& c) { c.rope_rescale_coords = 2.0; }, "rescale") / coords;
  EXPECT_LT((rescaled - rescaled[0][0]).abs().max().item<double>(), 1e-4) << "one scale for both axes";
  EXPECT_GE(rescaled.min().item<double>(), 0.5 - 1e-6);
  EXPECT_LE(rescaled.max().item<double>(), 2.0 + 1e-6);
}

// Small versions of the family's options, all at once and one by one: every parameter gets a gradient (a tensor the
// forward pass never reads would train nothing), and the analytic parameter count equals the model's.
TEST(FamilyModel, EveryParameterLearnsAndIsCounted) {
  auto base = [] {
    ModelConfig m;
    m.img_h = m.img_w = 16, m.patch_size = 4, m.embed_dim = 32, m.depth = 2, m.num_heads = 4, m.num_classes = 3;
    return m;
  };
  std::vector<ModelConfig> configs;
  {
    ModelConfig m = base();
    m.class_token = false, m.reg_tokens = 2, m.no_embed_class = true, m.pre_norm = true, m.qk_norm = true;
    m.global_pool = GlobalPool::map, m.act_layer = Activation::quick_gelu, m.init_values = 0.1;
    configs.push_back(m);
  }
  {
    ModelConfig m = base();
    m.reg_tokens = 3, m.global_pool = GlobalPool::avg, m.fc_norm = false, m.act_layer = Activation::gelu_tanh;
    configs.push_back(m);
  }
  {
    ModelConfig m = base();
    m.reg_tokens = 1, m.final_norm = false, m.no_embed_class = true;
    configs.push_back(m);
  }
  // timm's Eva class: learned rotary frequencies, AttentionRope's q_proj / k_proj / v_proj, split SwiGLU with
  // mlp.norm, attn.norm, q / k norms, gamma_1 only, a MAP head with its own heads and width over all tokens.
  {
    ModelConfig m = base();
    m.model_class = ModelClass::eva, m.use_abs_pos_emb = false, m.use_rot_pos_emb = true;
    m.rope_type = RopeType::mixed, m.rope_grid_indexing = GridIndexing::xy, m.attn_type = AttnType::rope;
    m.qkv_fused = false, m.swiglu_mlp = true, m.scale_mlp = true, m.scale_attn_inner = true, m.qk_norm = true;
    m.init_values = 0.1, m.attn_only_layer_scale = true, m.reg_tokens = 1, m.global_pool = GlobalPool::map;
    m.attn_pool_num_heads = 2, m.attn_pool_mlp_ratio = 2.0;
    configs.push_back(m);
  }
  // EVA-02's: rotary cat over a reference grid with an offset and half rotation, q_bias / v_bias, packed SwiGLU,
  // a learned pos_embed beside it (no_embed_class), average pooling.
  {
    ModelConfig m = base();
    m.model_class = ModelClass::eva, m.use_rot_pos_emb = true, m.ref_feat_h = 8, m.ref_feat_w = 6;
    m.rope_grid_offset = 1.0, m.rope_rotate_half = true, m.swiglu_mlp = true, m.mlp_ratio = 8.0 / 3.0;
    m.init_values = 0.1, m.no_embed_class = true, m.global_pool = GlobalPool::avg;
    configs.push_back(m);
  }
  // DINOv3's rotary periods, SwiGLU aligned to 16 (fc1_g / fc1_x), norm_pre, class-token pooling.
  {
    ModelConfig m = base();
    m.model_class = ModelClass::eva, m.use_abs_pos_emb = false, m.use_rot_pos_emb = true;
    m.rope_type = RopeType::dinov3, m.rope_temperature = 100.0, m.swiglu_mlp = true, m.swiglu_align_to = 16;
    m.pre_norm = true, m.reg_tokens = 4;
    configs.push_back(m);
  }
  // AIMv2's: RmsNorm (also patch_embed.norm and q / k norms), SwiGLU fc1_g / fc1_x without biases, SiLU, avg pooling.
  {
    ModelConfig m = base();
    m.norm_layer = NormLayer::rmsnorm, m.embed_norm_layer = NormLayer::rmsnorm, m.mlp_layer = MlpLayer::swiglu;
    m.act_layer = Activation::silu, m.proj_bias = false, m.qkv_bias = false, m.qk_norm = true;
    m.class_token = false, m.global_pool = GlobalPool::avg, m.fc_norm = false;
    configs.push_back(m);
  }
  // DINOv2 giant's packed SwiGLU with LayerScale and a MAP head (its MLP stays timm's Mlp); a LayerNorm on the patches.
  {
    ModelConfig m = base();
    m.mlp_layer = MlpLayer::swiglu_packed, m.act_layer = Activation::silu, m.mlp_ratio = 5.0, m.init_values = 0.1;
    m.embed_norm_layer = NormLayer::layernorm, m.global_pool = GlobalPool::map, m.class_token = false;
    configs.push_back(m);
  }
  // Eva's post-norm blocks; Sapiens2's grouped-query attention (one key/value head for four, then two) with qk_norm,
  // DINOv3 rotary and its training-time coordinate augmentations.
  {
    ModelConfig m = base();
    m.model_class = ModelClass::eva, m.use_post_norm = true, m.use_rot_pos_emb = true;
    configs.push_back(m);
  }
  {
    ModelConfig m = base();
    m.model_class = ModelClass::eva, m.attn_type = AttnType::rope, m.qkv_fused = false, m.num_kv_heads = {1, 2};
    m.qk_norm = true, m.use_abs_pos_emb = false, m.use_rot_pos_emb = true, m.rope_type = RopeType::dinov3;
    m.rope_shift_coords = 0.5, m.rope_jitter_coords = 1.5, m.rope_rescale_coords = 2.0,
    m.norm_layer = NormLayer::rmsnorm;
    configs.push_back(m);
  }
  torch::manual_seed(0);
  for (const auto& m : configs) {
    SCOPED_TRACE(to_json(m).dump());
    VisionTransformer net(m);
    const auto logits = net->forward(torch::randn({2, 3, 16, 16}));
    ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{2, 3}));
    logits.pow(2).sum().backward();
    for (const auto& p : net->named_parameters()) {
      ASSERT_TRUE(p.value().grad().defined()) << p.key() << " has no gradient";
      EXPECT_GT(p.value().grad().abs().sum().item<double>(), 0.0) << p.key() << " has a zero gradient";
    }
    int64_t counted = 0;
    for (const auto& cost : layer_costs(m)) counted += cost.params;
    EXPECT_EQ(counted, count_parameters(*net));
    // Token count: prefix tokens first, then the patches.
    Capture capture;
    capture.attention = true;
    torch::NoGradGuard no_grad;
    net->forward_features(torch::randn({1, 3, 16, 16}), {}, &capture);
    EXPECT_EQ(capture.attention_probs[0].size(-1), m.num_prefix_tokens() + 16);
  }
}

TEST(FamilyModel, ConfigRoundTripsAndRefusesWhatDoesNotFit) {
  ModelConfig m = model_preset("vit_small_patch14_reg4_dinov2");
  EXPECT_EQ(m.reg_tokens, 4);
  EXPECT_TRUE(m.no_embed_class);
  EXPECT_EQ(m.img_h, 518);
  EXPECT_EQ(m.pos_embed_prefix(), 0);
  EXPECT_EQ(m.num_prefix_tokens(), 5);
  const auto again = parse_model_config(to_json(m), "round trip");
  EXPECT_EQ(to_json(again), to_json(m));
  const ModelConfig clip = model_preset("vit_base_patch16_clip_quickgelu_224");
  EXPECT_TRUE(clip.pre_norm);
  EXPECT_EQ(clip.act_layer, Activation::quick_gelu);
  EXPECT_DOUBLE_EQ(clip.layer_norm_eps, 1e-5);
  const ModelConfig siglip = model_preset("vit_base_patch16_siglip_224");
  EXPECT_EQ(siglip.global_pool, GlobalPool::map);
  EXPECT_FALSE(siglip.class_token);
  auto error = [](const std::string& text) {
    return test::error_of([&] { parse_model_config(nlohmann::json::parse(text), "c.json"); });
  };
  EXPECT_NE(error(R"({"reg_tokens": -1})").find("model.reg_tokens"), std::string::npos);
  EXPECT_NE(error(R"({"act_layer": "relu"})").find("model.act_layer"), std::string::npos);
  EXPECT_NE(error(R"({"fc_norm": 1})").find("model.fc_norm"), std::string::npos);
  EXPECT_NE(error(R"({"class_token": false})").find("\"token\" pooling needs class_token"), std::string::npos);
  EXPECT_NE(test::error_of([] { model_preset("deit_base_distilled_patch16_224"); }).find("unknown model preset"),
            std::string::npos);
  // AIMv2 and DINOv2 giant by name; VisionTransformer's MLP forms, refused on Eva and at an odd packed width.
  const ModelConfig aimv2 = model_preset("aimv2_large_patch14_224");
  EXPECT_EQ(aimv2.norm_layer, NormLayer::rmsnorm);
  EXPECT_EQ(aimv2.embed_norm_layer, NormLayer::rmsnorm);
  EXPECT_EQ(aimv2.mlp_layer, MlpLayer::swiglu);
  EXPECT_FALSE(aimv2.proj_bias);
  EXPECT_EQ(model_preset("vit_giant_patch14_dinov2").mlp_hidden(), 4096);  // fc1: 8192 rows, half of them gates
  EXPECT_NE(error(R"({"model_class": "eva", "mlp_layer": "swiglu"})")
                .find("model.mlp_layer: is an option of timm's VisionTransformer"),
            std::string::npos);
  EXPECT_NE(error(R"({"embed_dim": 96, "num_heads": 4, "mlp_ratio": 1.03125, "mlp_layer": "swiglu_packed"})")
                .find("swiglu_packed needs an even fc1 width (embed_dim * mlp_ratio = 99)"),
            std::string::npos);
}

}  // namespace
}  // namespace vit
