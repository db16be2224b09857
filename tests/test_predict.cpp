// The library behind predict, export-attention and evaluate's report, without the vit binary: classifying image files
// (src/infer/): per-image errors for broken and missing files, input order, logits independent of the batch size,
// top-k; export_attention_images() over the same inputs; evaluation_report() and confusion_csv().
#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include "data/image.h"
#include "explain/attention_export_run.h"
#include "image/decode.h"
#include "infer/inputs.h"
#include "infer/predict.h"
#include "io/model_file.h"
#include "test_util.h"
#include "train/evaluate.h"

namespace vit {
namespace {
namespace fs = std::filesystem;

constexpr int64_t kClasses = 5;

// A random tiny classifier (32x32 RGB, 5 classes) in eval mode on the CPU.
LoadedModel tiny_model() {
  torch::manual_seed(3);
  LoadedModel model;
  model.net = VisionTransformer(test::tiny_vit(/*img=*/32, /*patch=*/8, /*in_chans=*/3, /*num_classes=*/kClasses,
                                              /*embed_dim=*/32, /*depth=*/2, /*num_heads=*/2, /*mlp_ratio=*/2.0));
  model.net->eval();
  model.class_names = numbered_classes(kClasses);
  model.path = "tiny";
  return model;
}

// Images of different sizes, channel counts and formats in `dir`, with a broken file and a missing path among them.
struct Inputs {
  std::vector<std::string> paths;
  std::vector<bool> good;  // per path
};
Inputs write_inputs(const test::TempDir& dir) {
  Inputs inputs;
  cv::RNG rng(7);
  auto add_image = [&](const std::string& name, int height, int width, int type) {
    cv::Mat image(height, width, type);
    rng.fill(image, cv::RNG::UNIFORM, 0, 256);
    const std::string path = dir.file(name);
    if (!cv::imwrite(path, image)) throw std::runtime_error("cannot write " + path);
    inputs.paths.push_back(path), inputs.good.push_back(true);
  };
  auto add_bad = [&](const std::string& path) { inputs.paths.push_back(path), inputs.good.push_back(false); };
  add_image("a.png", 40, 56, CV_8UC3);
  test::write_bytes(dir.file("broken.jpg"), "this is not a JPEG\n");
  add_bad(dir.file("broken.jpg"));
  add_image("b.jpg", 32, 32, CV_8UC3);
  add_image("gray.png", 20, 17, CV_8UC1);
  add_bad(dir.file("missing.png"));
  add_image("c.png", 64, 33, CV_8UC4);
  add_image("d.bmp", 31, 45, CV_8UC3);
  return inputs;
}

TEST(Predict, BrokenAndMissingFilesGetErrorsOthersAreClassifiedInInputOrder) {
  test::TempDir dir;
  const Inputs inputs = write_inputs(dir);
  auto model = tiny_model();
  const auto predictions = predict_images(model, inputs.paths, {/*topk=*/3, /*batch_size=*/2, ImageLimits{}});
  ASSERT_EQ(predictions.size(), inputs.paths.size());
  for (size_t i = 0; i < predictions.size(); ++i) {
    const auto& p = predictions[i];
    EXPECT_EQ(p.path, inputs.paths[i]);
    EXPECT_EQ(p.ok(), inputs.good[i]) << p.path << ": " << p.error;
    if (!inputs.good[i]) {
      EXPECT_EQ(p.error.rfind(p.path, 0), 0u) << "the error names the file: " << p.error;
      EXPECT_EQ(p.error.find('\n'), std::string::npos) << p.error;
      EXPECT_TRUE(p.top_index.empty() && p.logits.empty());
      continue;
    }
    EXPECT_EQ(p.top_index.size(), 3u);
    EXPECT_EQ(p.logits.size(), static_cast<size_t>(kClasses));
  }
}

TEST(Predict, LogitsDoNotDependOnTheBatchSizeAndMatchOneForward) {
  test::TempDir dir;
  const Inputs inputs = write_inputs(dir);
  auto model = tiny_model();
  const auto one = predict_images(model, inputs.paths, {/*topk=*/kClasses, /*batch_size=*/1, ImageLimits{}});
  for (const int64_t batch_size : {3, 16}) {
    const auto many = predict_images(model, inputs.paths, {/*topk=*/kClasses, /*batch_size=*/batch_size, ImageLimits{}});
    ASSERT_EQ(many.size(), one.size());
    double worst = 0;
    for (size_t i = 0; i < one.size(); ++i) {
      ASSERT_EQ(many[i].ok(), one[i].ok());
      for (size_t k = 0; k < one[i].logits.size(); ++k) {
        worst = std::max(worst, static_cast<double>(std::abs(many[i].logits[k] - one[i].logits[k])));
      }
    }
    std::cout << "batch " << batch_size << " vs 1: logits max |d| " << worst << "\n";
    EXPECT_LE(worst, 1e-6) << "batch size " << batch_size;
  }
  // The same logits as the shared preprocessing and one forward pass of that image alone.
  torch::NoGradGuard no_grad;
  const auto input = preprocess(decode_image(inputs.paths[0]), model.preprocess, 32, 32, 3);
  const auto expected = model.net->forward(input.unsqueeze(0))[0];
  const auto got = torch::tensor(one[0].logits);
  const double diff = test::max_abs_diff(got, expected);
  std::cout << "predict vs forward: logits max |d| " << diff << "\n";
  EXPECT_LE(diff, 1e-6);
}

// eval_hflip (carried in the model file): an image and its mirror get the same logits, the mean of the two plain
// passes' logits, which differ from either.
TEST(Predict, EvalHflipScoresTheMeanOfAnImageAndItsMirror) {
  test::TempDir dir;
  cv::RNG rng(11);
  cv::Mat image(32, 40, CV_8UC3);
  rng.fill(image, cv::RNG::UNIFORM, 0, 256);
  cv::Mat mirror;
  cv::flip(image, mirror, /*flipCode=*/1);
  const std::vector<std::string> paths{dir.file("image.png"), dir.file("mirror.png")};
  ASSERT_TRUE(cv::imwrite(paths[0], image) && cv::imwrite(paths[1], mirror));
  auto trained = tiny_model();
  Preprocess preprocess;
  preprocess.eval_hflip = true;
  save_model(dir.file("model.safetensors"), trained.net, preprocess, trained.class_names);
  auto model = load_model(dir.file("model.safetensors"));
  ASSERT_TRUE(model.preprocess.eval_hflip) << "the model file carries eval_hflip";
  const auto averaged = predict_images(model, paths, {/*topk=*/kClasses, /*batch_size=*/2, ImageLimits{}});
  model.preprocess.eval_hflip = false;
  const auto plain = predict_images(model, paths, {/*topk=*/kClasses, /*batch_size=*/2, ImageLimits{}});
  ASSERT_TRUE(averaged[0].ok() && averaged[1].ok() && plain[0].ok() && plain[1].ok());
  const auto a = torch::tensor(averaged[0].logits), b = torch::tensor(averaged[1].logits);
  const auto mean = (torch::tensor(plain[0].logits) + torch::tensor(plain[1].logits)) / 2;
  const double mirrored = test::max_abs_diff(a, b), to_mean = test::max_abs_diff(a, mean);
  const double to_plain = test::max_abs_diff(a, torch::tensor(plain[0].logits));
  std::cout << "eval_hflip: image vs mirror max |d| " << mirrored << ", vs the plain passes' mean " << to_mean
            << ", vs the plain pass " << to_plain << "\n";
  EXPECT_LE(mirrored, 1e-6);
  EXPECT_LE(to_mean, 1e-5);
  EXPECT_GT(to_plain, 1e-3) << "the mirror's pass changes the logits";
}

TEST(Predict, TopkIsSortedInRangeCappedAndTheSoftmaxOfTheLogits) {
  test::TempDir dir;
  const Inputs inputs = write_inputs(dir);
  auto model = tiny_model();
  for (const int64_t topk : {int64_t{1}, int64_t{3}, int64_t{50}}) {
    for (const auto& p : predict_images(model, inputs.paths, {topk, /*batch_size=*/4, ImageLimits{}})) {
      if (!p.ok()) continue;
      const auto expected_count = static_cast<size_t>(std::min(topk, kClasses));
      ASSERT_EQ(p.top_index.size(), expected_count);
      ASSERT_EQ(p.top_prob.size(), expected_count);
      const auto probs = torch::tensor(p.logits).softmax(0);
      std::vector<bool> seen(kClasses, false);
      for (size_t k = 0; k < p.top_index.size(); ++k) {
        const int64_t index = p.top_index[k];
        ASSERT_GE(index, 0);
        ASSERT_LT(index, kClasses);
        EXPECT_FALSE(seen[index]) << "class " << index << " listed twice";
        seen[index] = true;
        EXPECT_NEAR(p.top_prob[k], probs[index].item<float>(), 1e-6);
        if (k > 0) {
          EXPECT_GE(p.top_prob[k - 1], p.top_prob[k]);
        }
      }
      if (topk >= kClasses) {
        EXPECT_NEAR(std::accumulate(p.top_prob.begin(), p.top_prob.end(), 0.0), 1.0, 1e-5);
      }
    }
  }
}

TEST(Predict, BatchesArriveInOrderAndBadOptionsThrow) {
  test::TempDir dir;
  const Inputs inputs = write_inputs(dir);  // 7 paths
  auto model = tiny_model();
  std::vector<size_t> sizes;
  std::vector<std::string> order;
  predict_images(model, inputs.paths, {/*topk=*/2, /*batch_size=*/3, ImageLimits{}}, [&](const std::vector<Prediction>& batch) {
    sizes.push_back(batch.size());
    for (const auto& p : batch) order.push_back(p.path);
  });
  EXPECT_EQ(sizes, (std::vector<size_t>{3, 3, 1}));
  EXPECT_EQ(order, inputs.paths);
  EXPECT_TRUE(predict_images(model, {}, {}).empty());
  EXPECT_THROW(predict_images(model, inputs.paths, {/*topk=*/0, /*batch_size=*/2, ImageLimits{}}), std::invalid_argument);
  EXPECT_THROW(predict_images(model, inputs.paths, {/*topk=*/1, /*batch_size=*/0, ImageLimits{}}), std::invalid_argument);
}

TEST(PrepareImages, InputsAtTheModelsSizeAndTheOriginalsOnRequest) {
  test::TempDir dir;
  const Inputs inputs = write_inputs(dir);
  const auto model = tiny_model();
  const auto images = prepare_images(inputs.paths, model.preprocess, model.config(), ImageLimits{}, /*keep_bgr=*/true);
  ASSERT_EQ(images.size(), inputs.paths.size());
  int64_t prepared = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    EXPECT_EQ(images[i].path, inputs.paths[i]);
    EXPECT_EQ(images[i].ok(), inputs.good[i]) << images[i].error;
    if (!images[i].ok()) {
      EXPECT_TRUE(images[i].image_bgr.empty());
      continue;
    }
    ++prepared;
    EXPECT_EQ(images[i].input.sizes(), (std::vector<int64_t>{3, 32, 32}));
    EXPECT_EQ(images[i].image_bgr.type(), CV_8UC3);
  }
  EXPECT_EQ(images[0].image_bgr.rows, 40);  // a.png at its own size
  EXPECT_EQ(images[0].image_bgr.cols, 56);
  EXPECT_EQ(stack_inputs(images).sizes(), (std::vector<int64_t>{prepared, 3, 32, 32}));
  EXPECT_TRUE(prepare_images(inputs.paths, model.preprocess, model.config(), ImageLimits{})[0].image_bgr.empty());
  EXPECT_FALSE(stack_inputs({}).defined());
}

TEST(ExportImages, FailedImagesAreListedTheOthersExportedInOrder) {
  test::TempDir dir;
  const Inputs inputs = write_inputs(dir);
  auto model = tiny_model();
  AttentionExportOptions options;
  options.write_npy = false;
  std::vector<std::string> reported;
  const auto run = export_attention_images(model, inputs.paths, dir.file("out"), options,
                                 [&](const std::string& path, const AttentionExportResult* result, const std::string& error,
                                     double seconds) {
                                   reported.push_back(path);
                                   EXPECT_EQ(result == nullptr, !error.empty()) << path;
                                   EXPECT_GE(seconds, 0.0);
                                 });
  EXPECT_EQ(reported, inputs.paths);
  ASSERT_EQ(run.errors.size(), 2u);
  EXPECT_EQ(run.errors[0].image, dir.file("broken.jpg"));
  EXPECT_EQ(run.errors[1].image, dir.file("missing.png"));
  ASSERT_EQ(run.results.size(), 5u);
  EXPECT_EQ(run.results[0].dir_name, "a");
  EXPECT_EQ(run.results[4].dir_name, "d");
  for (const auto& result : run.results) {
    EXPECT_TRUE(fs::exists(dir.file("out/" + result.dir_name + "/summary.json"))) << result.dir_name;
  }
}

TEST(EvaluationReport, PerClassMistakesAndConfusionCsv) {
  EvalResult result;
  result.count = 6;
  result.loss = 0.5, result.top1 = 50.0, result.top5 = 100.0;
  result.confusion = torch::tensor({2, 1, 0, 3}, torch::kInt64).reshape({2, 2});  // rows: true, columns: predicted
  result.mistakes = {{/*index=*/4, /*label=*/0, /*predicted=*/1, /*confidence=*/0.75}};
  const auto report = evaluation_report(result, {"ant", "bee"}, [](int64_t index) {
    return "sample" + std::to_string(index);
  });
  EXPECT_EQ(report["samples"], 6);
  EXPECT_EQ(report["top1"], 50.0);
  ASSERT_EQ(report["per_class"].size(), 2u);
  EXPECT_EQ(report["per_class"][0]["class"], "ant");
  EXPECT_NEAR(report["per_class"][0]["precision"].get<double>(), 100.0, 1e-9);     // 2 of 2 predicted ants
  EXPECT_NEAR(report["per_class"][0]["recall"].get<double>(), 200.0 / 3, 1e-9);    // 2 of 3 true ants
  EXPECT_NEAR(report["per_class"][1]["precision"].get<double>(), 75.0, 1e-9);      // 3 of 4 predicted bees
  EXPECT_EQ(report["confident_mistakes"][0],
            nlohmann::json({{"source", "sample4"}, {"label", "ant"}, {"predicted", "bee"}, {"confidence", 0.75}}));
  EXPECT_EQ(confusion_csv(result.confusion, {"ant", "bee"}), "true\\predicted,ant,bee\nant,2,1\nbee,0,3\n");
  // Every sample's prediction, in index order, a source with a comma or a quote quoted as CSV does.
  const std::vector<SamplePrediction> predictions{{7, 1, 1, 0.5}, {2, 0, 1, 0.75}};
  EXPECT_EQ(predictions_csv(predictions, {"ant", "bee"},
                            [](int64_t i) { return i == 2 ? std::string("a,\"b\".png") : "s" + std::to_string(i); }),
            "index,source,label,predicted,confidence\n2,\"a,\"\"b\"\".png\",ant,bee,0.750000\n7,s7,bee,bee,0.500000\n");
}

}  // namespace
}  // namespace vit
