// Any resolution, through the CLI, against timm from PyPI: `--img-size` (predict, export-attention, evaluate, info)
// runs a model at a larger square or a rectangular size with timm's dynamic_img_size numbers (logits within 1e-4,
// attention within 1e-5); a model loaded into a config of another img_size is resampled at load as timm's checkpoint
// filter does; the model's own size is unchanged bit for bit; bad sizes fail naming the nearest valid ones.
// References come from tests/reference_family.py (`dynamic`), run by the project's reference Python.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "export/export.h"
#include "io/model_file.h"
#include "io/npy.h"
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

// The logits `vit predict --json ARGS` prints for its one image, (1, K).
torch::Tensor predicted_logits(const std::string& args, std::string* log = nullptr) {
  const auto result = test::run_vit("predict --json " + args);
  EXPECT_EQ(result.status, 0) << result.errors;
  if (log != nullptr) *log = result.errors;
  if (result.status != 0) return torch::zeros({1, 1});
  const auto printed = nlohmann::json::parse(result.output);
  return torch::tensor(printed.at(0).at("logits").get<std::vector<float>>()).unsqueeze(0);
}

struct SizeCase {
  std::string name, arch, args;
  std::vector<std::array<int64_t, 2>> sizes;  // the trained size, then a larger square, then a rectangle
};

void PrintTo(const SizeCase& c, std::ostream* os) { *os << c.name << " (" << c.arch << ")"; }

class TimmDynamicSize : public ::testing::TestWithParam<SizeCase> {};

TEST_P(TimmDynamicSize, CliMatchesTimmAtEverySize) {
  SKIP_WITHOUT_PYTHON("timm", "safetensors", "PIL");
  const auto& c = GetParam();
  TempDir dir;
  std::string sizes;
  for (const auto& s : c.sizes) {
    if (!sizes.empty()) sizes += ",";
    sizes += std::to_string(s[0]);
    sizes += "x";
    sizes += std::to_string(s[1]);
  }
  run_python("reference_family.py", "dynamic " + test::quoted(dir.path()) + " --arch " + c.arch + " --args " +
                                        test::quoted(c.args) + " --sizes " + sizes);
  const std::string snap = dir / "snapshot";
  const auto ref = safetensors::read(dir / "ref.safetensors");
  const auto model = load_model(snap);
  const int64_t P = model.config().patch_size, prefix = model.config().num_prefix_tokens();

  for (size_t i = 0; i < c.sizes.size(); ++i) {
    const auto [h, w] = c.sizes[i];
    const std::string at = std::to_string(i), size = std::to_string(h) + "x" + std::to_string(w);
    const std::string image = test::quoted(dir / ("image." + at + ".png"));
    const auto logits = predicted_logits("--checkpoint " + test::quoted(snap) + " --img-size " + size + " " + image);
    const double logit_diff = max_abs_diff(logits, ref.tensor("logits." + at));

    // Attention and maps at the new grid.
    const std::string maps = dir / ("maps." + at);
    const auto exported = test::run_vit("export-attention --checkpoint " + test::quoted(snap) + " --img-size " + size +
                                        " --format npy --out " + test::quoted(maps) + " " + image);
    ASSERT_EQ(exported.status, 0) << exported.errors;
    const std::string stem = maps + "/image." + at;
    double attention_diff = 0;
    for (int64_t b = 0; b < model.config().depth; ++b) {
      const auto attention = read_npy(stem + "/attn_" + std::to_string(b) + ".npy");  // (nh, N, N)
      ASSERT_EQ(attention.size(1), prefix + (h / P) * (w / P));
      attention_diff = std::max(attention_diff,
                                max_abs_diff(attention, ref.tensor("attn." + at + "." + std::to_string(b))[0]));
    }
    EXPECT_EQ(read_npy(stem + "/rollout.npy").sizes(), (std::vector<int64_t>{h / P, w / P}));
    std::cout << c.name << " at " << size << ": --img-size max |d| logits " << logit_diff << ", attention "
              << attention_diff;
    EXPECT_LE(logit_diff, kLogitTolerance);
    EXPECT_LE(attention_diff, kAttentionTolerance);

    if (i == 0) {
      // The model's own size: the same numbers with and without the option, bit for bit.
      const auto plain = predicted_logits("--checkpoint " + test::quoted(snap) + " " + image);
      std::cout << ", without --img-size max |d| " << max_abs_diff(plain, logits) << "\n";
      EXPECT_TRUE(torch::equal(plain, logits));
      continue;
    }
    // The folder loaded into a config of this img_size: resampled at load, as timm creates it at that size.
    nlohmann::json config = {{"model", to_json(model.config())}};
    config["model"]["img_size"] = {h, w};
    test::write_bytes(dir / "config.json", config.dump());
    std::string log;
    const auto loaded = predicted_logits(
        "--checkpoint " + test::quoted(snap) + " --config " + test::quoted(dir / "config.json") + " " + image, &log);
    const double fixed_diff = max_abs_diff(loaded, ref.tensor("fixed." + at));
    std::cout << ", resampled at load max |d| " << fixed_diff << " (vs --img-size " << max_abs_diff(loaded, logits)
              << ")\n";
    EXPECT_NE(log.find("pos_embed resampled from a " + std::to_string(model.config().grid_h()) + "x" +
                       std::to_string(model.config().grid_w()) + " to a " + std::to_string(h / P) + "x" +
                       std::to_string(w / P) + " grid"),
              std::string::npos)
        << log;
    EXPECT_LE(fixed_diff, kLogitTolerance);
    EXPECT_LE(max_abs_diff(loaded, logits), 1e-6);
  }
}

constexpr const char* kTiny = R"("depth": 2, "embed_dim": 64, "num_heads": 4, "num_classes": 5)";
std::string tiny(const std::string& extra = "") {
  return std::string("{") + kTiny + (extra.empty() ? "" : ", " + extra) + "}";
}

INSTANTIATE_TEST_SUITE_P(
    Models, TimmDynamicSize,
    ::testing::Values(
        // A class token with a position embedding row of its own.
        SizeCase{"vit", "vit_small_patch16_224", tiny(), {{32, 32}, {64, 64}, {48, 80}}},
        // Registers and no_embed_class (the prefix tokens have no rows), LayerScale, patch 14.
        SizeCase{"dinov2_reg", "vit_small_patch14_reg4_dinov2", tiny(), {{28, 28}, {56, 56}, {42, 70}}},
        // No class token, a MAP head over the patches.
        SizeCase{"siglip", "vit_base_patch16_siglip_224", tiny(), {{32, 32}, {64, 64}, {48, 80}}}),
    [](const ::testing::TestParamInfo<SizeCase>& info) { return info.param.name; });

// The example of the issue: a plain timm file with --config at another img_size fails no more; the pos_embed is
// resampled at load and gives the numbers of --img-size on the trained config.
TEST(AnyResolution, PlainTimmFileIntoAnotherImgSize) {
  TempDir dir;
  const std::string config = test::write_tiny32_config(dir);
  const std::string weights = test::quoted(test::data_path("tiny32/weights.safetensors"));
  const std::string image = test::quoted(test::data_path("tiny32/chelsea.png"));
  std::string log;
  const auto resized = predicted_logits(
      "--checkpoint " + weights + " --config " + test::quoted(config) + " --set model.img_size=64 " + image, &log);
  EXPECT_NE(log.find("pos_embed resampled from a 2x2 to a 4x4 grid (64x64 input)"), std::string::npos) << log;
  const auto dynamic =
      predicted_logits("--checkpoint " + weights + " --config " + test::quoted(config) + " --img-size 64 " + image);
  std::cout << "tiny32 at 64: resampled at load vs --img-size max |d| " << max_abs_diff(resized, dynamic) << "\n";
  EXPECT_LE(max_abs_diff(resized, dynamic), 1e-6);
  // The trained size runs as before.
  EXPECT_FALSE(torch::equal(resized, predicted_logits("--checkpoint " + weights + " --config " +
                                                       test::quoted(config) + " " + image)));
}

// vit export --img-size: the model written at another size as its own (the position embedding resampled once, as a
// --config at that size does at load) for every format; predicting from it equals predicting at that size.
TEST(AnyResolution, ExportWritesTheModelAtAnotherSize) {
  TempDir dir;
  const std::string original = "--checkpoint " + test::quoted(test::data_path("tiny32/weights.safetensors")) +
                               " --config " + test::quoted(test::write_tiny32_config(dir)) + " ";
  const std::string base = "export " + original;
  const std::string image = test::quoted(test::data_path("tiny32/chelsea.png"));
  const std::string file = dir.file("m64.safetensors"), folder = dir.file("timm48x64");
  auto exported = test::run_vit(base + "--format vit --img-size 64 --out " + test::quoted(file));
  ASSERT_EQ(exported.status, 0) << exported.errors;
  EXPECT_NE(exported.errors.find("pos_embed resampled from a 2x2 to a 4x4 grid (64x64 input)"), std::string::npos)
      << exported.errors;
  const auto own = load_model(file);
  EXPECT_EQ(own.net->config().img_h, 64);
  EXPECT_EQ(own.net->pos_embed.size(1), 1 + 16);
  const auto at_load = predicted_logits("--checkpoint " + test::quoted(file) + " " + image);
  const auto dynamic = predicted_logits(original + "--img-size 64 " + image);
  std::cout << "export --img-size 64 vs predict --img-size 64: max |d| logits " << max_abs_diff(at_load, dynamic) << "\n";
  EXPECT_LE(max_abs_diff(at_load, dynamic), 1e-6);

  exported = test::run_vit(base + "--format timm --img-size 48x64 --out " + test::quoted(folder));
  ASSERT_EQ(exported.status, 0) << exported.errors;
  const auto config = nlohmann::json::parse(read_file(folder + "/config.json"));
  EXPECT_EQ(config["model_args"]["img_size"], nlohmann::json::array({48, 64})) << config.dump();
  const auto rectangle = predicted_logits("--checkpoint " + test::quoted(folder) + " " + image);
  const auto rectangle_dynamic = predicted_logits(original + "--img-size 48x64 " + image);
  std::cout << "export --img-size 48x64 (timm) vs predict --img-size 48x64: max |d| logits "
            << max_abs_diff(rectangle, rectangle_dynamic) << "\n";
  EXPECT_LE(max_abs_diff(rectangle, rectangle_dynamic), 1e-6);
  if (onnx_export_available()) {  // the ONNX writer takes the network as built, its input at the new size
    exported = test::run_vit(base + "--format onnx --img-size 64 --out " + test::quoted(dir.file("m64.onnx")));
    ASSERT_EQ(exported.status, 0) << exported.errors;
    EXPECT_TRUE(file_exists(dir.file("m64.onnx")));
  }
  // The model's own size writes it unchanged; a size the patch does not divide fails before anything is written.
  exported = test::run_vit(base + "--format vit --img-size 32 --out " + test::quoted(dir.file("m32.safetensors")));
  ASSERT_EQ(exported.status, 0) << exported.errors;
  EXPECT_EQ(exported.errors.find("resampled"), std::string::npos) << exported.errors;
  const auto bad = test::run_vit(base + "--format vit --img-size 33 --out " + test::quoted(dir.file("bad.safetensors")));
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.errors.find("--img-size 33: 33 is not a multiple of the patch size 16 (nearest valid: 32 or 48)"),
            std::string::npos) << bad.errors;
  EXPECT_FALSE(file_exists(dir.file("bad.safetensors")));
}

TEST(AnyResolution, BadSizesNameTheNearestValidOnes) {
  TempDir dir;
  const std::string base = "--checkpoint " + test::quoted(test::data_path("tiny32/weights.safetensors")) +
                           " --config " + test::quoted(test::write_tiny32_config(dir)) + " ";
  std::string image = " ";  // (appended, not " " + ...: GCC 12 warns falsely on that)
  image += test::quoted(test::data_path("tiny32/chelsea.png"));
  struct Bad {
    std::string option, message;
  };
  for (const auto& bad : std::vector<Bad>{
           {"30", "--img-size 30: 30 is not a multiple of the patch size 16 (nearest valid: 16 or 32)"},
           {"8", "8 is not a multiple of the patch size 16 (nearest valid: 16)"},
           {"32x40", "width 40 is not a multiple of the patch size 16 (nearest valid: 32 or 48)"},
           {"0", "\"0\" has a zero side"},
           {"big", "\"big\" is not N or HxW"},
           {"32,64", "lists several sizes; this command takes one"},
           {"65552x16", "--img-size 65552x16: 65552x16 is too large (each side at most 65536, at most 65536 patches "
                        "of 16)"},
           {"99999999999999999999", "99999999999999999999"}}) {
    const auto result = test::run_vit("predict " + base + "--img-size " + bad.option + image);
    EXPECT_NE(result.status, 0) << bad.option;
    EXPECT_NE(result.errors.find(bad.message), std::string::npos) << bad.option << ": " << result.errors;
  }
  // vit info counts tokens and MACs at the size: a size past the bounds is refused before any count can overflow.
  const auto huge = test::run_vit("info " + base + "--img-size 999984");
  EXPECT_EQ(huge.status, 2) << huge.errors;
  EXPECT_NE(huge.errors.find("999984x999984 is too large"), std::string::npos) << huge.errors;
  const auto info = test::run_vit("info " + base + "--img-size 33");
  EXPECT_NE(info.status, 0);
  EXPECT_NE(info.errors.find("33 is not a multiple of the patch size 16 (nearest valid: 32 or 48)"),
            std::string::npos)
      << info.errors;
}

// vit info --img-size: tokens, output shapes and MACs at that size; the parameters of the model as built.
TEST(AnyResolution, InfoAtAnotherSize) {
  TempDir dir;
  const std::string config = test::quoted(test::write_tiny32_config(dir));
  const auto own = test::run_vit("info --json --config " + config);
  const auto other = test::run_vit("info --json --config " + config + " --img-size 64x48");
  ASSERT_EQ(own.status, 0) << own.errors;
  ASSERT_EQ(other.status, 0) << other.errors;
  const auto a = nlohmann::json::parse(own.output), b = nlohmann::json::parse(other.output);
  EXPECT_EQ(a["tokens"], 5);
  EXPECT_EQ(b["tokens"], 1 + 4 * 3);
  EXPECT_EQ(b["input_size"], nlohmann::json::array({64, 48}));
  EXPECT_EQ(a["parameters"], b["parameters"]);
  // The MACs at 64x48 are those of the same model built at 64x48; the parameters stay those of the 32x32 one.
  ModelConfig m = parse_model_config(a["model"], "info");
  ModelConfig built = m;
  built.img_h = 64, built.img_w = 48;
  EXPECT_EQ(forward_macs(m, 64, 48), forward_macs(built));
  EXPECT_NEAR(b["gmacs"].get<double>(), static_cast<double>(forward_macs(built)) / 1e9, 1e-12);
  int64_t params = 0;
  for (const auto& cost : layer_costs(m, 64, 48)) params += cost.params;
  EXPECT_EQ(params, a["parameters"].get<int64_t>());
  std::cout << "tiny32: " << a["gmacs"] << " GMACs at 32x32, " << b["gmacs"] << " at 64x48\n";
}

// vit evaluate --img-size A,B,C scores each size in one run; the model's own size scores as without the option.
TEST(AnyResolution, EvaluateSeveralSizes) {
  TempDir dir;
  test::write_idx_dataset(dir / "data", 384, 96);
  nlohmann::json doc = {
      {"model", {{"img_size", 16}, {"patch_size", 4}, {"in_chans", 1}, {"num_classes", 4}, {"embed_dim", 32},
                 {"depth", 2}, {"num_heads", 2}, {"mlp_ratio", 2.0}}},
      {"data", {{"format", "mnist"}, {"root", dir / "data"}, {"mean", {0.5}}, {"std", {0.5}}, {"num_workers", 2}}},
      {"train", {{"epochs", 2}, {"batch_size", 16}, {"lr", 2e-3}, {"warmup_steps", 5}, {"threads", 2}, {"seed", 3},
                 {"output_root", dir / "runs"}}}};
  test::write_bytes(dir / "config.json", doc.dump(2));
  const auto trained =
      test::run_vit("train --config " + test::quoted(dir / "config.json") + " --out " + test::quoted(dir / "run"));
  ASSERT_EQ(trained.status, 0) << trained.errors;
  const std::string base = "evaluate --checkpoint " + test::quoted(dir / "run/best.safetensors") + " --config " +
                           test::quoted(dir / "config.json") + " --json";
  const auto plain = test::run_vit(base);
  const auto several = test::run_vit(base + " --img-size 16,24,20x32 --out " + test::quoted(dir / "eval"));
  ASSERT_EQ(plain.status, 0) << plain.errors;
  ASSERT_EQ(several.status, 0) << several.errors;
  const auto one = nlohmann::json::parse(plain.output), all = nlohmann::json::parse(several.output);
  ASSERT_EQ(all["sizes"].size(), 3u);
  EXPECT_EQ(all["sizes"][0]["img_size"], nlohmann::json::array({16, 16}));
  EXPECT_EQ(all["sizes"][2]["img_size"], nlohmann::json::array({20, 32}));
  EXPECT_EQ(all["sizes"][0]["top1"], one["top1"]);
  EXPECT_EQ(all["sizes"][0]["loss"], one["loss"]);
  for (const char* name : {"confusion_16x16.csv", "confusion_24x24.csv", "confusion_20x32.csv", "report.json"}) {
    EXPECT_TRUE(file_exists(dir / (std::string("eval/") + name))) << name;
  }
  for (const auto& s : all["sizes"]) {
    std::cout << "at " << s["img_size"] << ": top-1 " << s["top1"] << ", loss " << s["loss"] << "\n";
  }
  // The other sizes really run at their size: another input, another loss.
  EXPECT_NE(all["sizes"][1]["loss"], one["loss"]);
  EXPECT_NE(all["sizes"][2]["loss"], all["sizes"][1]["loss"]);
  EXPECT_GT(one["top1"].get<double>(), 60.0);
  // A bad size fails before anything is scored.
  const auto bad = test::run_vit(base + " --img-size 16,18");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.errors.find("18 is not a multiple of the patch size 4 (nearest valid: 16 or 20)"), std::string::npos)
      << bad.errors;
}

}  // namespace
}  // namespace vit
