// `vit export-attention --method ...` through the built binary: every map against tests/reference_explain.py (timm's
// model on tests/data/tiny32, token and average pooling, the predicted and a given class, --start-layer), and the
// faithfulness comparison (per image, over the folder, the plots and the gallery's data).
#include <cstdio>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "io/npy.h"
#include "io/safetensors.h"
#include "test_util.h"
#include "util/fs.h"

namespace vit {
namespace {

using test::quoted;
using test::TempDir;

const std::string kWeights = test::data_path("tiny32/weights.safetensors");
const std::string kChelsea = test::data_path("tiny32/chelsea.png");
const std::string kSynthetic = test::data_path("tiny32/synthetic.png");
const char* kMethods[] = {"raw", "rollout", "grad_rollout", "attribution", "gradcam"};

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(read_file(path)); }

// tiny32's model with the given pooling; with average pooling the final norm stays on the tokens (fc_norm false), so
// the same timm weights load.
std::string write_config(const TempDir& dir, const std::string& pool) {
  const std::string path = dir.file("tiny32_" + pool + ".json");
  test::write_bytes(path, R"({
    "model": {"img_size": 32, "patch_size": 16, "in_chans": 3, "num_classes": 10, "embed_dim": 64, "depth": 2,
              "num_heads": 2, "global_pool": ")" + pool + R"(", "fc_norm": false},
    "data": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "crop_pct": 1.0}
  })");
  return path;
}

struct MapCase {
  std::string name, pool;
  int target;  // -1: the predicted class
  int start_layer;
};

void PrintTo(const MapCase& c, std::ostream* os) { *os << c.name; }

class ExplainMethods : public ::testing::TestWithParam<MapCase> {};

TEST_P(ExplainMethods, EveryMapMatchesThePythonReferenceWithin1e5) {
  SKIP_WITHOUT_PYTHON("timm", "safetensors", "PIL");
  const MapCase& c = GetParam();
  {
    TempDir dir;
    test::run_python("reference_explain.py",
                     "maps " + quoted(kWeights) + " --model " +
                         quoted(R"({"img_size": 32, "patch_size": 16, "num_classes": 10, "embed_dim": 64, )"
                                R"("depth": 2, "num_heads": 2, "global_pool": ")" + c.pool + R"(", "fc_norm": false})") +
                         " --preprocess " +
                         quoted(R"({"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "crop_pct": 1.0,)"
                                R"( "interpolation": "bicubic"})") +
                         " --images " + quoted(kChelsea + "," + kSynthetic) + " --class " +
                         std::to_string(c.target) + " --start-layer " + std::to_string(c.start_layer) + " --ref " +
                         quoted(dir / "ref.safetensors"));
    const auto ref = safetensors::read(dir / "ref.safetensors");
    std::string arguments = "export-attention --checkpoint " + quoted(kWeights) + " --config " +
                            quoted(write_config(dir, c.pool)) + " --out " + quoted(dir / "out") +
                            " --method all --format npy --start-layer " + std::to_string(c.start_layer) + " ";
    if (c.target >= 0) arguments += "--class " + std::to_string(c.target) + " ";
    const auto result = test::run_vit(arguments + quoted(kChelsea) + " " + quoted(kSynthetic));
    ASSERT_EQ(result.status, 0) << result.output << result.errors;
    for (const std::string stem : {"chelsea", "synthetic"}) {
      const auto summary = read_json(dir / "out" + "/" + stem + "/summary.json");
      const int64_t explained = ref.tensor(stem + "/class").item<int64_t>();
      for (const auto& map : summary["method"]["maps"]) {
        if (map.at("class_specific") == true) {
          EXPECT_EQ(map.at("class"), explained) << map.dump();
        }
      }
      const std::string readout = summary.at("method").at("readout");
      EXPECT_NE(readout.find(c.pool == "avg" ? "mean of the patch rows" : "class token"), std::string::npos)
          << readout;
      for (const char* key : kMethods) {
        const auto got = read_npy(dir / "out" + "/" + stem + "/" + key + ".npy");
        const auto want = ref.tensor(stem + "/" + key);
        ASSERT_EQ(got.sizes(), want.sizes()) << stem << " " << key;
        const double delta = test::max_abs_diff(got, want);
        std::printf("%-5s class %2d start %d %-9s %-12s max |delta| vs reference = %.3g\n", c.pool.c_str(),
                    c.target, c.start_layer, stem.c_str(), key, delta);
        EXPECT_LE(delta, 1e-5) << stem << " " << key;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Readouts, ExplainMethods,
                         ::testing::Values(MapCase{"token_predicted", "token", -1, 0}, MapCase{"token_class3", "token", 3, 1},
                                           MapCase{"avg_predicted", "avg", -1, 0}, MapCase{"avg_class3", "avg", 3, 1}),
                         [](const auto& info) { return info.param.name; });

TEST(ExplainMethods, AveragePoolingReadsThePatchRowsNotTheClassToken) {
  // The same weights read two ways: rollout with token pooling is the class token's row, with average pooling the
  // mean of the patch rows, which differ on this model (the reference test pins both to timm's numbers).
  TempDir dir;
  std::vector<torch::Tensor> maps;
  for (const std::string pool : {"token", "avg"}) {
    const auto result = test::run_vit("export-attention --checkpoint " + quoted(kWeights) + " --config " +
                                      quoted(write_config(dir, pool)) + " --out " + quoted(dir / pool) +
                                      " --format npy " + quoted(kChelsea));
    ASSERT_EQ(result.status, 0) << result.output << result.errors;
    maps.push_back(read_npy(dir / pool + "/chelsea/rollout.npy"));
  }
  const double delta = test::max_abs_diff(maps[0], maps[1]);
  std::printf("rollout, token vs avg readout: max |delta| = %.3g\n", delta);
  EXPECT_GT(delta, 1e-3);
}

TEST(ExplainFaithfulness, EveryMethodGetsFourCurvesAndTheFolderATable) {
  TempDir dir;
  const std::string out = dir / "out";
  const auto result = test::run_vit("export-attention --checkpoint " + quoted(kWeights) + " --config " +
                                    quoted(write_config(dir, "token")) + " --out " + quoted(out) +
                                    " --method all --faithfulness " + quoted(kChelsea) + " " + quoted(kSynthetic));
  ASSERT_EQ(result.status, 0) << result.output << result.errors;
  std::vector<nlohmann::json> images;
  for (const std::string stem : {"chelsea", "synthetic"}) {
    const auto summary = read_json(out + "/" + stem + "/summary.json");
    const auto& f = summary["faithfulness"];
    ASSERT_TRUE(f.is_object()) << stem;
    EXPECT_EQ(f["metrics"]["insertion"]["better"], "higher");
    EXPECT_EQ(f["metrics"]["negative"]["better"], "higher");
    EXPECT_EQ(f["metrics"]["positive"]["fractions"], nlohmann::json({0.0, 0.0, 0.0, 0.25, 0.25, 0.5, 0.5, 0.5, 0.75,
                                                                     0.75}));  // floor(0.4 i) of 4 patches
    const double intact = summary["prediction"]["topk"][0]["prob"].get<double>();
    for (const std::string key : {"raw", "rollout", "grad_rollout", "attribution", "gradcam", "random"}) {
      SCOPED_TRACE(stem + " " + key);
      const auto& curves = f["curves"][key];
      ASSERT_TRUE(curves.is_object());
      // Deletion starts from the intact image and ends blank; insertion the other way round.
      EXPECT_NEAR(curves["deletion"]["probs"][0].get<double>(), intact, 1e-5);
      EXPECT_NEAR(curves["insertion"]["probs"][4].get<double>(), intact, 1e-5);
      EXPECT_NEAR(curves["insertion"]["probs"][0].get<double>(), curves["deletion"]["probs"][4].get<double>(), 1e-6);
      EXPECT_NEAR(curves["positive"]["probs"][0].get<double>(), intact, 1e-5);
      EXPECT_NEAR(curves["negative"]["probs"][0].get<double>(), intact, 1e-5);
      // Positive perturbation takes the deletion order at 0, 25, 50 and 75%: the same images, the same numbers.
      EXPECT_NEAR(curves["positive"]["probs"][5].get<double>(), curves["deletion"]["probs"][2].get<double>(), 1e-6);
      // Negative perturbation blanks the least relevant first: at 75% only the most relevant patch is left, as
      // insertion has it at 25%.
      EXPECT_NEAR(curves["negative"]["probs"][9].get<double>(), curves["insertion"]["probs"][1].get<double>(), 1e-6);
    }
    EXPECT_TRUE(file_exists(out + "/" + stem + "/faithfulness.png"));
    for (const char* key : kMethods) EXPECT_TRUE(file_exists(out + "/" + stem + "/" + key + ".png")) << key;
    images.push_back(summary);
  }

  // The folder: means of the per-image AUCs, one row per method and the random order, and the mean curves' plot.
  const auto folder = read_json(out + "/summary.json");
  const auto& table = folder["faithfulness"]["table"];
  ASSERT_EQ(table.size(), 6u) << folder.dump(2);
  EXPECT_EQ(folder["faithfulness"]["images"], 2);
  for (const auto& row : table) {
    const std::string key = row["method"];
    for (const char* metric : {"deletion", "insertion", "positive", "negative"}) {
      const double mean = (images[0]["faithfulness"]["curves"][key][metric]["auc"].get<double>() +
                           images[1]["faithfulness"]["curves"][key][metric]["auc"].get<double>()) / 2;
      EXPECT_NEAR(row[metric].get<double>(), mean, 1e-12) << key << " " << metric;
    }
    EXPECT_GE(row["positive_accuracy"].get<double>(), 0.0);
    EXPECT_LE(row["negative_accuracy"].get<double>(), 0.9);
    if (key != "random") {
      EXPECT_TRUE(row.contains("deletion_beats_random")) << key;
    }
    std::printf("%-13s deletion %.4f insertion %.4f positive %.4f negative %.4f\n", key.c_str(),
                row["deletion"].get<double>(), row["insertion"].get<double>(), row["positive"].get<double>(),
                row["negative"].get<double>());
  }
  EXPECT_EQ(folder["faithfulness"]["plot"], "faithfulness.png");
  EXPECT_TRUE(file_exists(out + "/faithfulness.png"));
  const std::string page = read_file(out + "/index.html");
  EXPECT_NE(page.find(R"("table":[{"method":"raw")"), std::string::npos);
  EXPECT_NE(page.find("faith-table"), std::string::npos);
}

TEST(ExplainFaithfulness, AGivenClassIsExplainedAndMeasured) {
  TempDir dir;
  const std::string out = dir / "out";
  const auto result = test::run_vit("export-attention --checkpoint " + quoted(kWeights) + " --config " +
                                    quoted(write_config(dir, "token")) + " --out " + quoted(out) +
                                    " --method attribution,gradcam --class 4 --faithfulness " + quoted(kChelsea));
  ASSERT_EQ(result.status, 0) << result.output << result.errors;
  const auto summary = read_json(out + "/chelsea/summary.json");
  EXPECT_EQ(summary["faithfulness"]["class"], 4);
  EXPECT_EQ(summary["faithfulness"]["class_source"], "--class");
  ASSERT_EQ(summary["method"]["maps"].size(), 2u);
  EXPECT_EQ(summary["method"]["maps"][0]["key"], "attribution");
  EXPECT_EQ(summary["method"]["maps"][1]["class"], 4);
  EXPECT_FALSE(file_exists(out + "/chelsea/rollout.npy"));  // only the methods asked for
  EXPECT_TRUE(file_exists(out + "/chelsea/gradcam.npy"));
}

}  // namespace
}  // namespace vit
