// `vit export-attention` through the built binary: parity with timm's attention and rollout (tests/data/tiny32),
// file formats (NumPy reads the .npy files), overlay sizes, rectangular grids, head masks, bad and huge images.
#include <sys/resource.h>

#include <cstdio>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "explain/attention_export.h"
#include "io/model_file.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "test_util.h"
#include "util/fs.h"

namespace vit {
namespace {

using test::TempDir;

const std::string kWeights = test::data_path("tiny32/weights.safetensors");
const std::string kChelsea = test::data_path("tiny32/chelsea.png");
const std::string kSynthetic = test::data_path("tiny32/synthetic.png");

using test::quoted;
using test::write_tiny32_config;  // the timm file carries no metadata: the architecture comes from --config

test::CommandResult export_tiny32(const TempDir& dir, const std::string& out, const std::string& arguments) {
  return test::run_vit("export-attention --checkpoint " + quoted(kWeights) + " --config " +
                       quoted(write_tiny32_config(dir)) + " --out " + quoted(out) + " " + arguments);
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(read_file(path)); }

// Width and height from a PNG's IHDR chunk, without decoding (the 6000 x 4000 overlays are large).
std::pair<int, int> png_size(const std::string& path) {
  const std::string bytes = read_file(path);
  EXPECT_GE(bytes.size(), 24u) << path;
  EXPECT_EQ(bytes.substr(1, 3), "PNG") << path;
  auto be32 = [&](size_t at) {
    return (static_cast<unsigned char>(bytes[at]) << 24) | (static_cast<unsigned char>(bytes[at + 1]) << 16) |
           (static_cast<unsigned char>(bytes[at + 2]) << 8) | static_cast<unsigned char>(bytes[at + 3]);
  };
  return {static_cast<int>(be32(16)), static_cast<int>(be32(20))};
}

TEST(ExportAttention, Tiny32MatchesTimmReference) {
  TempDir dir;
  const std::string out = dir.file("out");
  const auto result = export_tiny32(dir, out, quoted(kChelsea) + " " + quoted(kSynthetic));
  ASSERT_EQ(result.status, 0) << result.output << result.errors;
  const auto archive = safetensors::read(test::data_path("tiny32/expected_tensors.safetensors"));
  const auto expected = read_json(test::data_path("tiny32/expected.json"));
  for (const std::string stem : {"chelsea", "synthetic"}) {
    for (int block = 0; block < 2; ++block) {
      const auto got = read_npy(out + "/" + stem + "/attn_" + std::to_string(block) + ".npy");
      auto want = archive.tensor(stem + "/attention." + std::to_string(block));
      ASSERT_EQ(got.sizes(), (std::vector<int64_t>{2, 5, 5})) << stem << " block " << block;
      ASSERT_EQ(want.numel(), got.numel());  // the reference may carry a leading batch dimension of 1
      want = want.reshape({2, 5, 5});
      const double delta = test::max_abs_diff(got, want);
      std::printf("%s attn_%d.npy: max |delta| vs timm = %.3g\n", stem.c_str(), block, delta);
      EXPECT_LE(delta, 1e-5) << stem << " block " << block;
    }
    const auto rollout = read_npy(out + "/" + stem + "/rollout.npy");
    ASSERT_EQ(rollout.sizes(), (std::vector<int64_t>{2, 2}));
    const double delta = test::max_abs_diff(rollout, archive.tensor(stem + "/rollout"));
    std::printf("%s rollout.npy: max |delta| vs reference rollout = %.3g\n", stem.c_str(), delta);
    EXPECT_LE(delta, 1e-5) << stem;

    const auto summary = read_json(out + "/" + stem + "/summary.json");
    EXPECT_EQ(summary["format"], "vit-attention-export");
    EXPECT_EQ(summary["format_version"], 2);
    EXPECT_EQ(summary["model"]["grid"], nlohmann::json({2, 2}));
    EXPECT_EQ(summary["method"]["rollout"]["head_fusion"], "mean");
    EXPECT_EQ(summary["method"]["rollout"]["discard_ratio"], 0.0);
    for (const auto& image : expected["images"]) {
      if (image["file"] == stem + ".png") {
        EXPECT_EQ(summary["prediction"]["class"], image["top5"][0]) << stem;
        EXPECT_NEAR(summary["prediction"]["topk"][0]["prob"].get<double>(),
                    image["probs"][image["top5"][0].get<int>()].get<double>(), 1e-5);
      }
    }
    for (const char* name : {"attn_0.npy", "attn_1.npy", "rollout.npy", "rollout.png", "attn_0.png", "attn_1.png",
                             "grid_layer_head.png", "preview.png", "summary.json"}) {
      EXPECT_TRUE(file_exists(out + "/" + stem + "/" + name)) << stem << "/" << name;
    }
  }
  EXPECT_TRUE(file_exists(out + "/index.html"));
}

TEST(ExportAttention, NpyFilesLoadInNumpy) {
  SKIP_WITHOUT_PYTHON("numpy");
  TempDir dir;
  const std::string out = dir.file("out");
  const auto result = export_tiny32(dir, out, "--grad-rollout --format npy " + quoted(kChelsea));
  ASSERT_EQ(result.status, 0) << result.output << result.errors;
  const std::string base = out + "/chelsea/";
  std::printf("%s", test::run_python("reference_numpy.py", "check " + quoted(base + "attn_0.npy:2x5x5") + " " +
                                                               quoted(base + "attn_1.npy:2x5x5") + " " +
                                                               quoted(base + "rollout.npy:2x2") + " " +
                                                               quoted(base + "grad_rollout.npy:2x2"))
                        .c_str());
  EXPECT_FALSE(file_exists(base + "rollout.png"));  // --format npy writes no pictures
  // NumPy's own writer is the reference for the bytes: same 64-byte aligned header.
  const std::string numpy_file = dir.file("numpy.npy");
  test::run_python("reference_numpy.py", "resave " + quoted(base + "rollout.npy") + " " + quoted(numpy_file));
  EXPECT_EQ(read_file(numpy_file), read_file(base + "rollout.npy"));
}

TEST(ExportAttention, OverlaysHaveTheInputResolutionAndGradRolloutTheGrid) {
  TempDir dir;
  cv::Mat image(61, 97, CV_8UC3);
  cv::randu(image, 0, 255);
  cv::circle(image, {70, 20}, 12, cv::Scalar(0, 0, 255), cv::FILLED);
  const std::string input = dir.file("odd size.png");  // a space in the name, too
  ASSERT_TRUE(cv::imwrite(input, image));
  const std::string out = dir.file("out");
  const auto result =
      export_tiny32(dir, out, "--grad-rollout --class 3 --colormap viridis --alpha 0.4 " + quoted(input));
  ASSERT_EQ(result.status, 0) << result.output << result.errors;
  const std::string base = out + "/odd size/";
  for (const char* name : {"rollout.png", "grad_rollout.png", "attn_0.png", "attn_1.png"}) {
    EXPECT_EQ(png_size(base + name), std::make_pair(97, 61)) << name;
  }
  const auto grad = read_npy(base + "grad_rollout.npy");
  EXPECT_EQ(grad.sizes(), (std::vector<int64_t>{2, 2}));
  EXPECT_NEAR(grad.max().item<float>(), 1.0f, 1e-6);
  const auto summary = read_json(base + "summary.json");
  EXPECT_EQ(summary["method"]["grad_rollout"]["class"], 3);
  EXPECT_EQ(summary["method"]["grad_rollout"]["class_source"], "--class");
  EXPECT_EQ(summary["image_size"]["width"], 97);
  EXPECT_EQ(summary["image_size"]["height"], 61);
  EXPECT_EQ(summary["files"]["grad_rollout_npy"], "grad_rollout.npy");
  EXPECT_EQ(summary["files"]["layer_png"], nlohmann::json({"attn_0.png", "attn_1.png"}));
  // The contact sheet: 2 layers x 2 heads of 128 px cells plus labels.
  const auto sheet = png_size(base + "grid_layer_head.png");
  EXPECT_GE(sheet.first, 2 * 128);
  EXPECT_GE(sheet.second, 2 * 48);
}

TEST(ExportAttention, RectangularModelGridComesFromTheModel) {
  TempDir dir;
  ModelConfig config = test::tiny_vit(/*img=*/32, /*patch=*/16, /*in_chans=*/3, /*num_classes=*/4, /*embed_dim=*/32,
                                      /*depth=*/3, /*num_heads=*/4, /*mlp_ratio=*/4.0);
  config.img_w = 48;  // 2 x 3 grid, N = 7: no square root anywhere
  torch::manual_seed(11);
  VisionTransformer net(config);
  const std::string model = dir.file("rect.safetensors");
  save_model(model, net, Preprocess{}, {"ant", "bee", "cat", "dog"});
  const std::string out = dir.file("out");
  const auto result = test::run_vit("export-attention --checkpoint " + quoted(model) + " --out " + quoted(out) +
                                    " --layers 2,0 --heads 3,1 --grad-rollout --rollout max --discard-ratio 0.2 " +
                                    quoted(kChelsea));
  ASSERT_EQ(result.status, 0) << result.output << result.errors;
  const std::string base = out + "/chelsea/";
  EXPECT_EQ(read_npy(base + "rollout.npy").sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(read_npy(base + "grad_rollout.npy").sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(read_npy(base + "attn_2.npy").sizes(), (std::vector<int64_t>{4, 7, 7}));  // every head, always
  EXPECT_EQ(read_npy(base + "attn_0.npy").sizes(), (std::vector<int64_t>{4, 7, 7}));
  EXPECT_FALSE(file_exists(base + "attn_1.npy"));  // not in --layers
  EXPECT_EQ(png_size(base + "rollout.png"), std::make_pair(32, 32));  // the input's size, not the model's
  const auto summary = read_json(base + "summary.json");
  EXPECT_EQ(summary["model"]["grid"], nlohmann::json({2, 3}));
  EXPECT_EQ(summary["method"]["layers"], nlohmann::json({2, 0}));
  EXPECT_EQ(summary["method"]["heads"], nlohmann::json({3, 1}));
  EXPECT_EQ(summary["method"]["rollout"]["head_fusion"], "max");
  EXPECT_DOUBLE_EQ(summary["method"]["rollout"]["discard_ratio"].get<double>(), 0.2);
  EXPECT_EQ(summary["method"]["grad_rollout"]["class"], summary["prediction"]["class"]);
  EXPECT_EQ(summary["method"]["grad_rollout"]["class_source"], "predicted");
}

TEST(ExportAttention, MaskedHeadsAreExportedAndMarked) {
  TempDir dir;
  const std::string plain = dir.file("plain"), masked = dir.file("masked");
  ASSERT_EQ(export_tiny32(dir, plain, quoted(kChelsea)).status, 0);
  const auto result = export_tiny32(dir, masked, "--mask-heads 0:1 " + quoted(kChelsea));
  ASSERT_EQ(result.status, 0) << result.output << result.errors;
  // Block 0's maps are exported unchanged (head 1 included); block 1 sees the ablated output downstream.
  EXPECT_TRUE(torch::equal(read_npy(plain + "/chelsea/attn_0.npy"), read_npy(masked + "/chelsea/attn_0.npy")));
  EXPECT_GT(test::max_abs_diff(read_npy(plain + "/chelsea/attn_1.npy"), read_npy(masked + "/chelsea/attn_1.npy")),
            1e-6);
  const auto summary = read_json(masked + "/chelsea/summary.json");
  EXPECT_EQ(summary["method"]["masked_heads"], nlohmann::json::parse(R"([{"layer": 0, "head": 1}])"));
  const std::string page = read_file(masked + "/index.html");
  EXPECT_NE(page.find(R"("on":[[true,false],[true,true]])"), std::string::npos);
  EXPECT_NE(page.find("masked heads"), std::string::npos);

  const auto bad = export_tiny32(dir, dir.file("bad"), "--mask-heads 0:2 " + quoted(kChelsea));
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.errors.find("head 2 out of range [0, 2)"), std::string::npos) << bad.errors;
}

TEST(ExportAttention, FaithfulnessDeletionCurves) {
  TempDir dir;
  const std::string out = dir.file("out");
  const auto result = export_tiny32(dir, out, "--faithfulness --grad-rollout " + quoted(kChelsea));
  ASSERT_EQ(result.status, 0) << result.output << result.errors;
  const auto summary = read_json(out + "/chelsea/summary.json");
  EXPECT_EQ(summary["format_version"], 2);
  const auto& f = summary["faithfulness"];
  ASSERT_TRUE(f.is_object()) << summary.dump(2);
  EXPECT_EQ(f["metrics"]["deletion"]["fractions"], nlohmann::json({0.0, 0.25, 0.5, 0.75, 1.0}));  // 4 patches
  EXPECT_EQ(f["metrics"]["deletion"]["better"], "lower");
  EXPECT_EQ(f["class"], summary["prediction"]["class"]);
  EXPECT_EQ(f["class_source"], "predicted");
  const auto& curves = f["curves"];
  std::vector<std::string> keys;
  for (const auto& [key, unused] : curves.items()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"grad_rollout", "random", "rollout"}));  // nlohmann::json sorts keys
  for (const auto& order : keys) {
    const auto& deletion = curves[order]["deletion"];
    ASSERT_EQ(deletion["probs"].size(), 5u) << order;
    // Nothing deleted yet: the prediction's own probability. All deleted: the same blank image for every order.
    EXPECT_NEAR(deletion["probs"][0].get<double>(), summary["prediction"]["topk"][0]["prob"].get<double>(), 1e-5);
    EXPECT_NEAR(deletion["probs"][4].get<double>(), curves["random"]["deletion"]["probs"][4].get<double>(), 1e-6);
    EXPECT_EQ(deletion["top1"][0], 1) << order;  // the intact image predicts the explained class
    const double auc = deletion["auc"].get<double>();
    EXPECT_GT(auc, 0.0);
    EXPECT_LT(auc, 1.0);
  }
  std::printf("deletion AUC: rollout %.4f, grad rollout %.4f, random %.4f\n",
              curves["rollout"]["deletion"]["auc"].get<double>(),
              curves["grad_rollout"]["deletion"]["auc"].get<double>(),
              curves["random"]["deletion"]["auc"].get<double>());
}

TEST(ExportAttention, BadImagesGetPredictsErrorsAndTheRestIsExported) {
  TempDir dir;
  const std::string bad = dir.file("broken.png");
  write_file_atomic(bad, "this is not a PNG");
  const std::string out = dir.file("out");
  const auto result = export_tiny32(dir, out, quoted(bad) + " " + quoted(kChelsea));
  EXPECT_EQ(result.status, 3) << result.output << result.errors;  // kPartial
  EXPECT_TRUE(file_exists(out + "/chelsea/summary.json"));
  EXPECT_FALSE(file_exists(out + "/broken"));
  const auto predicted = test::run_vit("predict --checkpoint " + quoted(kWeights) + " --config " +
                                       quoted(write_tiny32_config(dir)) + " " + quoted(bad));
  EXPECT_EQ(predicted.status, 1);  // its only input failed
  // The same line predict prints for the same file.
  const std::string line = predicted.output.substr(0, predicted.output.find('\n'));
  ASSERT_NE(line.find("broken.png: error: "), std::string::npos) << predicted.output;
  EXPECT_NE(result.output.find(line), std::string::npos) << result.output << "\nexpected: " << line;
  EXPECT_NE(read_file(out + "/index.html").find("broken.png"), std::string::npos);
}

TEST(ExportAttention, BadOptionsFailBeforeWork) {
  TempDir dir;
  const std::string out = dir.file("out");
  struct Case {
    std::string arguments, message;
  };
  const std::vector<Case> cases = {
      {"--discard-ratio 1", "discard ratio 1 is outside [0, 1)"},
      {"--rollout median", "median"},
      {"--colormap rainbow", "rainbow"},
      {"--format jpg", "jpg"},
      {"--alpha 1.5", "1.5"},
      {"--layers 2", "--layers: 2 is out of range [0, 2)"},
      {"--heads 0,x", "--heads: \"x\" is not an index"},
      {"--grad-rollout --class 10", "--class 10 is out of range [0, 10)"},
      {"--class 10", "--class 10 is out of range [0, 10)"},
      {"--method rollout,shap", "unknown method \"shap\" (allowed: all or raw, rollout, grad-rollout, attribution, gradcam)"},
      {"--method rollout,rollout", "--method: rollout is listed twice"},
      {"--method all --start-layer 2", "--start-layer 2 is out of range [0, 2)"},
  };
  for (const auto& c : cases) {
    const auto result = export_tiny32(dir, out, c.arguments + " " + quoted(kChelsea));
    EXPECT_EQ(result.status, 2) << c.arguments << "\n" << result.errors;
    EXPECT_NE((result.output + result.errors).find(c.message), std::string::npos)
        << c.arguments << ": " << result.output << result.errors;
  }
  EXPECT_FALSE(file_exists(out + "/chelsea"));
}

TEST(ExportView, CentreCropWindowAsPreprocessComputesIt) {
  Preprocess p;
  p.crop_pct = 0.875;
  // 477 x 720, square 224 target: shorter side to floor(224 / 0.875) = 256, longer int(256 * 720 / 477) = 386;
  // crop offsets round((256 - 224) / 2) = 16 and round((386 - 224) / 2) = 81.
  const auto view = model_view(477, 720, p, 224, 224);
  EXPECT_DOUBLE_EQ(view.top, 16.0 / 256);
  EXPECT_DOUBLE_EQ(view.bottom, 240.0 / 256);
  EXPECT_DOUBLE_EQ(view.left, 81.0 / 386);
  EXPECT_DOUBLE_EQ(view.right, 305.0 / 386);
  // Rectangular 32 x 48 target: (floor(32 / .875), floor(48 / .875)) = (36, 54). crop_mode center keeps the square
  // image square, scaled until both sides cover that (timm's ResizeKeepRatio): 54 x 54, offsets 11 and 3.
  const auto rect = model_view(100, 100, p, 32, 48);
  EXPECT_DOUBLE_EQ(rect.top, 11.0 / 54);
  EXPECT_DOUBLE_EQ(rect.left, 3.0 / 54);
  EXPECT_DOUBLE_EQ(rect.right, 51.0 / 54);
  // crop_mode squash resizes to (36, 54) itself: offsets 2 and 3.
  p.crop_mode = CropMode::squash;
  const auto squashed = model_view(100, 100, p, 32, 48);
  EXPECT_DOUBLE_EQ(squashed.top, 2.0 / 36);
  EXPECT_DOUBLE_EQ(squashed.left, 3.0 / 54);
  // At crop_pct 1, squash sees the whole image; center (timm's default) the middle square of a landscape photo.
  p.crop_pct = 1.0;
  EXPECT_TRUE(model_view(477, 720, p, 224, 224).whole());
  p.crop_mode = CropMode::center;
  const auto middle = model_view(477, 720, p, 224, 224);
  EXPECT_DOUBLE_EQ(middle.top, 0.0);
  EXPECT_NEAR(middle.left, (338 - 224) / 2.0 / 338, 1e-12);  // 224 x int(224 * 720 / 477) = 338

  // The heatmap covers the window only; outside, the image is dimmed to half brightness.
  const cv::Mat image(477, 720, CV_8UC3, cv::Scalar(200, 100, 50));
  cv::Mat heat(2, 2, CV_32F, cv::Scalar(1.0f));
  const cv::Mat overlay = overlay_in_view(image, heat, view, "jet", 0.5);
  ASSERT_EQ(overlay.size(), image.size());
  EXPECT_EQ(overlay.at<cv::Vec3b>(5, 5), cv::Vec3b(100, 50, 25));
  EXPECT_EQ(overlay.at<cv::Vec3b>(470, 715), cv::Vec3b(100, 50, 25));
  const cv::Rect window = view.in(image.size());
  EXPECT_EQ(window, cv::Rect(151, 30, 418, 417));  // lround(81/386 * 720) = 151, lround(16/256 * 477) = 30
  EXPECT_NE(overlay.at<cv::Vec3b>(240, 360), cv::Vec3b(100, 50, 25));
  EXPECT_NE(overlay.at<cv::Vec3b>(240, 360), cv::Vec3b(200, 100, 50));
}

TEST(ExportAttention, LargePhotoStaysWithinMemory) {
  TempDir dir;
  // 6000 x 4000: a smooth gradient with shapes and noise, as JPEG like a camera's.
  cv::Mat photo(4000, 6000, CV_8UC3);
  for (int y = 0; y < photo.rows; ++y) {
    auto* row = photo.ptr<cv::Vec3b>(y);
    for (int x = 0; x < photo.cols; ++x) row[x] = cv::Vec3b(x * 255 / 6000, y * 255 / 4000, 128);
  }
  cv::circle(photo, {4200, 1500}, 900, cv::Scalar(30, 200, 240), cv::FILLED);
  const std::string input = dir.file("photo.jpg");
  ASSERT_TRUE(cv::imwrite(input, photo, {cv::IMWRITE_JPEG_QUALITY, 85}));
  photo.release();
  const std::string out = dir.file("out");
  const auto result = export_tiny32(dir, out, "--layers 1 --grad-rollout " + quoted(input));
  ASSERT_EQ(result.status, 0) << result.output << result.errors;
  rusage usage{};
  ASSERT_EQ(getrusage(RUSAGE_CHILDREN, &usage), 0);
  const double peak_mb = usage.ru_maxrss / 1024.0;  // the largest child this test process has waited for
  std::printf("6000x4000 export: peak RSS %.0f MB\n%s", peak_mb, result.output.c_str());
  EXPECT_LT(peak_mb, 2500.0);
  for (const char* name : {"rollout.png", "grad_rollout.png", "attn_1.png"}) {
    EXPECT_EQ(png_size(out + "/photo/" + name), std::make_pair(6000, 4000)) << name;
  }
  const auto preview = png_size(out + "/photo/preview.png");
  EXPECT_EQ(std::max(preview.first, preview.second), 960);
}

}  // namespace
}  // namespace vit
