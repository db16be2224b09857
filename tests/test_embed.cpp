// `vit embed` through the built binary: features.npy equal to the library's forward_head(forward_features(x), true)
// and block_<i>.npy to Capture::block_outputs pooled each way (1e-6), both against timm on tests/data/tiny32 (1e-4,
// references from tests/reference_embed.py), index.csv against `vit predict`'s top-1, a bad image skipped with exit
// status 3, bad --layers and --pool failing clearly; and stdout of `vit predict --json` staying data only while the
// progress report logs on a stderr that is not a terminal.
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>

#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>

#include "config/config.h"
#include "data/image.h"
#include "image/decode.h"
#include "infer/embed.h"
#include "io/model_file.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "test_util.h"
#include "util/fs.h"

namespace vit {
namespace {

using test::max_abs_diff;
using test::quoted;
using test::TempDir;

constexpr double kLibraryTolerance = 1e-6;
constexpr double kTimmTolerance = 1e-4;

// A random tiny classifier saved as a model file in `dir`: 32x32 RGB, 3 blocks, 5 classes, with `reg_tokens`
// register tokens; without a class token it pools the patch mean.
std::string save_tiny_model(const TempDir& dir, const std::string& name, bool class_token, int64_t reg_tokens) {
  torch::manual_seed(11);
  ModelConfig config = test::tiny_vit(/*img=*/32, /*patch=*/8, /*in_chans=*/3, /*num_classes=*/5, /*embed_dim=*/32,
                                      /*depth=*/3, /*num_heads=*/2, /*mlp_ratio=*/2.0);
  config.class_token = class_token;
  config.reg_tokens = reg_tokens;
  if (!class_token) config.global_pool = GlobalPool::avg;
  VisionTransformer net(config);
  // Perturbed so that tokens, norms and biases all matter (the default init leaves them at 0 or 1).
  torch::NoGradGuard no_grad;
  for (auto& p : net->parameters()) p.add_(torch::randn_like(p) * 0.05);
  const std::string path = dir.file(name);
  save_model(path, net, Preprocess{}, numbered_classes(5));
  return path;
}

// `count` random PNGs of assorted sizes in dir/images (sorted names: the order embed and predict list them).
std::vector<std::string> write_images(const TempDir& dir, int count) {
  std::vector<std::string> paths;
  cv::RNG rng(5);
  for (int i = 0; i < count; ++i) {
    cv::Mat image(30 + 7 * i, 41 - 3 * i, CV_8UC3);
    rng.fill(image, cv::RNG::UNIFORM, 0, 256);
    const std::string path = dir.file(std::string("images/img") + std::to_string(i) + ".png");
    make_dirs(dir.file("images"));
    if (!cv::imwrite(path, image)) throw std::runtime_error("cannot write " + path);
    paths.push_back(path);
  }
  return paths;
}

struct IndexRow {
  int64_t row;
  std::string path, predicted;
};
// index.csv as written for paths without commas or quotes (the quoting itself is tested on the library).
std::vector<IndexRow> read_index(const std::string& path) {
  std::istringstream lines(read_file(path));
  std::string line;
  std::getline(lines, line);
  EXPECT_EQ(line, "row,path,predicted");
  std::vector<IndexRow> rows;
  while (std::getline(lines, line)) {
    const auto first = line.find(','), last = line.rfind(',');
    rows.push_back(
        {std::stoll(line.substr(0, first)), line.substr(first + 1, last - first - 1), line.substr(last + 1)});
  }
  return rows;
}

// The library's view of the same files: their preprocessed inputs stacked, (B, C, H, W).
torch::Tensor library_inputs(const LoadedModel& model, const std::vector<std::string>& paths) {
  std::vector<torch::Tensor> rows;
  for (const auto& path : paths) {
    rows.push_back(preprocess(decode_image(path), model.preprocess, model.config().img_h, model.config().img_w,
                              model.config().in_chans));
  }
  return torch::stack(rows);
}

test::CommandResult embed(const std::string& checkpoint, const std::string& out, const std::string& arguments) {
  return test::run_vit("embed --threads 1 --checkpoint " + quoted(checkpoint) + " --out " + quoted(out) + " " +
                       arguments);
}

TEST(EmbedCli, FeaturesAndBlocksEqualTheLibrarysForwardPassWithin1e6) {
  TempDir dir;
  const std::string checkpoint = save_tiny_model(dir, "reg.safetensors", /*class_token=*/true, /*reg_tokens=*/2);
  const auto paths = write_images(dir, 5);
  auto model = load_model(checkpoint);
  model.net->eval();
  const int64_t prefix = model.net->num_prefix_tokens();
  ASSERT_EQ(prefix, 3);
  torch::NoGradGuard no_grad;
  Capture capture;
  capture.block_outputs = true;
  const auto tokens = model.net->forward_features(library_inputs(model, paths), {}, &capture);  // (B, N, D)
  const auto pre_logits = model.net->forward_head(tokens, /*pre_logits=*/true);                 // (B, D)
  auto patch_mean = [&](const torch::Tensor& t) { return t.narrow(1, prefix, t.size(1) - prefix).mean(1); };

  // Default: the head's pre-logits, over three batches (2, 2, 1).
  const auto features = embed(checkpoint, dir / "default", "--batch-size 2 " + quoted(dir / "images"));
  ASSERT_EQ(features.status, 0) << features.errors;
  EXPECT_EQ(features.output, "") << "stdout carries no data for embed";
  const auto got = read_npy(dir / "default/features.npy");
  ASSERT_EQ(got.sizes(), pre_logits.sizes());
  double diff = max_abs_diff(got, pre_logits);
  std::cout << "features.npy vs forward_head(forward_features(x), true): max |d| " << diff << "\n";
  EXPECT_LE(diff, kLibraryTolerance);
  const auto index = read_index(dir / "default/index.csv");
  ASSERT_EQ(index.size(), paths.size());
  for (size_t i = 0; i < paths.size(); ++i) {
    EXPECT_EQ(index[i].row, static_cast<int64_t>(i));
    EXPECT_EQ(index[i].path, paths[i]);
  }

  // --pool without --layers: forward_features' tokens (after the final norm), pooled.
  const auto pooled = embed(checkpoint, dir / "pooled", "--pool avg " + quoted(dir / "images"));
  ASSERT_EQ(pooled.status, 0) << pooled.errors;
  diff = max_abs_diff(read_npy(dir / "pooled/features.npy"), patch_mean(tokens));
  std::cout << "--pool avg vs forward_features' patch mean: max |d| " << diff << "\n";
  EXPECT_LE(diff, kLibraryTolerance);

  // --layers, each pooling; -1 is the last block (block_2.npy). The default pool of a class-token model is cls.
  for (const std::string pool : {"", "cls", "avg", "none"}) {
    const std::string out = dir / ("layers_" + pool);
    std::string arguments = "--batch-size 2 --layers 0,-1 ";
    if (!pool.empty()) arguments += "--pool " + pool + " ";
    const auto result = embed(checkpoint, out, arguments + quoted(dir / "images"));
    ASSERT_EQ(result.status, 0) << result.errors;
    EXPECT_FALSE(file_exists(out + "/features.npy"));
    for (const int64_t block : {0, 2}) {
      const auto& block_tokens = capture.outputs[block];  // (B, N, D), before the final norm
      const torch::Tensor expected = pool == "avg"    ? patch_mean(block_tokens)
                                     : pool == "none" ? block_tokens
                                                      : block_tokens.select(1, 0);
      const auto written = read_npy(out + "/block_" + std::to_string(block) + ".npy");
      ASSERT_EQ(written.sizes(), expected.sizes()) << pool << " block " << block;
      diff = max_abs_diff(written, expected);
      std::cout << "--layers block " << block << " --pool " << (pool.empty() ? "(default)" : pool)
                << " vs Capture::block_outputs: max |d| " << diff << "\n";
      EXPECT_LE(diff, kLibraryTolerance);
    }
  }
}

TEST(EmbedCli, WithoutAClassTokenBlocksPoolThePatchMeanAndClsFails) {
  TempDir dir;
  const std::string checkpoint = save_tiny_model(dir, "avg.safetensors", /*class_token=*/false, /*reg_tokens=*/1);
  const auto paths = write_images(dir, 3);
  auto model = load_model(checkpoint);
  model.net->eval();
  torch::NoGradGuard no_grad;
  Capture capture;
  capture.block_outputs = true;
  const auto tokens = model.net->forward_features(library_inputs(model, paths), {}, &capture);
  const auto result = embed(checkpoint, dir / "out", "--layers 1 " + quoted(dir / "images"));
  ASSERT_EQ(result.status, 0) << result.errors;
  const auto& block = capture.outputs[1];
  const double diff = max_abs_diff(read_npy(dir / "out/block_1.npy"), block.narrow(1, 1, block.size(1) - 1).mean(1));
  std::cout << "no class token, --layers 1 (default avg, the register excluded): max |d| " << diff << "\n";
  EXPECT_LE(diff, kLibraryTolerance);
  const auto features = embed(checkpoint, dir / "features", quoted(dir / "images"));
  ASSERT_EQ(features.status, 0) << features.errors;
  EXPECT_LE(max_abs_diff(read_npy(dir / "features/features.npy"), model.net->forward_head(tokens, true)),
            kLibraryTolerance);

  for (const std::string layers : {"", "--layers 0 "}) {
    const auto cls = embed(checkpoint, dir / "cls", layers + "--pool cls " + quoted(dir / "images"));
    EXPECT_EQ(cls.status, 2) << cls.errors;
    EXPECT_NE(cls.errors.find("--pool cls"), std::string::npos) << cls.errors;
    EXPECT_NE(cls.errors.find("no class token"), std::string::npos) << cls.errors;
    EXPECT_FALSE(file_exists(dir / "cls/index.csv"));
  }
}

TEST(EmbedCli, MatchesTimmOnTheReferenceModelWithin1e4) {
  SKIP_WITHOUT_PYTHON("timm", "safetensors", "PIL");
  TempDir dir;
  const std::string weights = test::data_path("tiny32/weights.safetensors");
  const std::string config = test::data_path("tiny32/config.json");
  const std::vector<std::string> images = {test::data_path("tiny32/chelsea.png"),
                                           test::data_path("tiny32/synthetic.png")};
  test::run_python("reference_embed.py",
                   "features " + quoted(weights) +
                       " --model " +
                       quoted(R"({"img_size": 32, "patch_size": 16, "num_classes": 10, "embed_dim": 64, "depth": 2,)"
                              R"( "num_heads": 2})") +
                       " --preprocess " +
                       quoted(R"({"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "crop_pct": 1.0,)"
                              R"( "interpolation": "bicubic"})") +
                       " --images " + quoted(images[0] + "," + images[1]) + " --ref " +
                       quoted(dir / "ref.safetensors"));
  const auto ref = safetensors::read(dir / "ref.safetensors");
  const std::string inputs = quoted(images[0]) + " " + quoted(images[1]);
  const std::string model_args = "--config " + quoted(config) + " ";

  const auto features = embed(weights, dir / "features", model_args + inputs);
  ASSERT_EQ(features.status, 0) << features.errors;
  double diff = max_abs_diff(read_npy(dir / "features/features.npy"), ref.tensor("features"));
  std::cout << "tiny32 features.npy vs timm forward_head(forward_features(x), pre_logits=True): max |d| " << diff
            << "\n";
  EXPECT_LE(diff, kTimmTolerance);
  // The predicted class is timm's argmax.
  const auto index = read_index(dir / "features/index.csv");
  ASSERT_EQ(index.size(), 2u);
  const auto timm_top = ref.tensor("logits").argmax(-1);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(index[i].path, images[i]);
    EXPECT_EQ(index[i].predicted, numbered_classes(10)[timm_top[i].item<int64_t>()]) << images[i];
  }

  for (const std::string pool : {"cls", "avg", "none"}) {
    const std::string out = dir / ("layers_" + pool);
    const auto result = embed(weights, out, model_args + "--layers 0,1 --pool " + pool + " " + inputs);
    ASSERT_EQ(result.status, 0) << result.errors;
    for (const std::string block : {"0", "1"}) {
      diff = max_abs_diff(read_npy(out + "/block_" + block + ".npy"), ref.tensor("block." + block + "." + pool));
      std::cout << "tiny32 block_" << block << ".npy --pool " << pool
                << " vs timm forward_intermediates: max |d| " << diff << "\n";
      EXPECT_LE(diff, kTimmTolerance);
    }
  }
}

TEST(EmbedCli, IndexMatchesPredictsTopOneAndABadImageIsSkippedWithStatus3) {
  TempDir dir;
  const std::string checkpoint = save_tiny_model(dir, "reg.safetensors", /*class_token=*/true, /*reg_tokens=*/0);
  auto paths = write_images(dir, 4);
  test::write_bytes(dir / "images/bad.png", "this is not a PNG\n");  // sorts before the good ones (img*.png)
  const auto result = embed(checkpoint, dir / "out", "--batch-size 3 " + quoted(dir / "images"));
  EXPECT_EQ(result.status, 3) << result.errors;
  EXPECT_NE(result.errors.find(dir / "images/bad.png"), std::string::npos)
      << "the error names the file: " << result.errors;
  EXPECT_NE(result.errors.find("1 of 5 images could not be embedded"), std::string::npos) << result.errors;

  const auto predicted = test::run_vit("predict --json --topk 1 --threads 1 --checkpoint " + quoted(checkpoint) + " " +
                                       quoted(dir / "images"));
  EXPECT_EQ(predicted.status, 3) << predicted.errors;
  const auto printed = nlohmann::json::parse(predicted.output);
  std::vector<std::pair<std::string, std::string>> top;  // (image, label) of the classified ones, in order
  for (const auto& image : printed) {
    if (image.contains("topk")) top.emplace_back(image["image"], image["topk"][0]["label"]);
  }
  const auto index = read_index(dir / "out/index.csv");
  ASSERT_EQ(index.size(), 4u);
  ASSERT_EQ(top.size(), 4u);
  for (size_t i = 0; i < index.size(); ++i) {
    EXPECT_EQ(index[i].row, static_cast<int64_t>(i));
    EXPECT_EQ(index[i].path, paths[i]);
    EXPECT_EQ(index[i].path, top[i].first);
    EXPECT_EQ(index[i].predicted, top[i].second) << index[i].path;
  }
  EXPECT_EQ(read_npy(dir / "out/features.npy").size(0), 4);

  // Nothing decodable: an error, and nothing written.
  const auto none = embed(checkpoint, dir / "none", quoted(dir / "images/bad.png"));
  EXPECT_EQ(none.status, 1) << none.errors;
  EXPECT_NE(none.errors.find("none of the 1 images could be decoded"), std::string::npos) << none.errors;
  EXPECT_FALSE(file_exists(dir / "none/index.csv"));
  EXPECT_FALSE(file_exists(dir / "none/features.npy"));
}

TEST(EmbedCli, BadLayersAndPoolFailNamingTheValue) {
  TempDir dir;
  const std::string checkpoint = save_tiny_model(dir, "m.safetensors", /*class_token=*/true, /*reg_tokens=*/0);
  write_images(dir, 1);
  const std::string images = quoted(dir / "images");
  struct Case {
    std::string arguments, message;
  };
  for (const Case& c : std::vector<Case>{
           {"--layers 3",
            "--layers: block 3 is out of range: the model has 3 blocks, valid are 0..2 (or -3..-1 from the end)"},
           {"--layers -4", "--layers: block -4 is out of range"},
           {"--layers 1,x", "--layers: \"x\" is not a block index"},
           {"--layers 2,-1", "--layers: block 2 is listed twice (2 and -1)"},
       }) {
    const auto result = embed(checkpoint, dir / "out", c.arguments + " " + images);
    EXPECT_EQ(result.status, 2) << c.arguments << ": " << result.errors;
    EXPECT_NE(result.errors.find(c.message), std::string::npos) << c.arguments << ": " << result.errors;
  }
  const auto bad_pool = embed(checkpoint, dir / "out", "--pool mean " + images);
  EXPECT_EQ(bad_pool.status, 2);
  EXPECT_NE(bad_pool.errors.find("mean"), std::string::npos) << bad_pool.errors;
  EXPECT_FALSE(file_exists(dir / "out"));
}

TEST(EmbedIndex, PathsAndClassNamesAreQuotedAsCsvNeeds) {
  Embeddings embeddings;
  embeddings.images = {{"plain.png", "", 0, 1}, {"bad.png", "bad.png: not an image", -1, -1},
                       {"a,b \"c\".png", "", 1, 0}, {"headless.png", "", 2, -1}};
  EXPECT_EQ(embedding_index_csv(embeddings, {"x, y", "cat"}),
            "row,path,predicted\n0,plain.png,cat\n1,\"a,b \"\"c\"\".png\",\"x, y\"\n2,headless.png,\n");
  EXPECT_EQ(embeddings.rows(), 3);
  EXPECT_EQ(parse_block_indices("3,-1,0", 12), (std::vector<int64_t>{3, 11, 0}));
}

// The progress report logs on stderr when it is not a terminal; stdout keeps exactly the JSON.
TEST(ProgressCli, PredictJsonStdoutStaysDataOverSeveralBatches) {
  TempDir dir;
  const std::string checkpoint = save_tiny_model(dir, "m.safetensors", /*class_token=*/true, /*reg_tokens=*/0);
  write_images(dir, 6);
  ::setenv("VIT_PROGRESS_INTERVAL", "0", 1);  // a log line per batch, not one per 10 s
  const auto result = test::run_vit("predict --json --batch-size 2 --threads 1 --checkpoint " + quoted(checkpoint) +
                                    " " + quoted(dir / "images"));
  const auto embedded = embed(checkpoint, dir / "out", "--batch-size 2 " + quoted(dir / "images"));
  // One batch: quiet, even with a line due at every advance.
  const auto single = test::run_vit("predict --json --threads 1 --checkpoint " + quoted(checkpoint) + " " +
                                    quoted(dir / "images"));
  ::unsetenv("VIT_PROGRESS_INTERVAL");
  ASSERT_EQ(result.status, 0) << result.errors;
  const auto printed = nlohmann::json::parse(result.output);  // throws (fails) on anything but the JSON
  EXPECT_EQ(printed.size(), 6u);
  EXPECT_NE(result.errors.find("predict: 2/6 (33%)"), std::string::npos) << result.errors;
  EXPECT_NE(result.errors.find("predict: 6/6 in "), std::string::npos) << result.errors;
  EXPECT_EQ(result.errors.find('\r'), std::string::npos) << "no bar when stderr is not a terminal";
  ASSERT_EQ(embedded.status, 0) << embedded.errors;
  EXPECT_NE(embedded.errors.find("embed: 4/6 (66%)"), std::string::npos) << embedded.errors;
  ASSERT_EQ(single.status, 0) << single.errors;
  EXPECT_EQ(single.errors.find("predict: "), std::string::npos) << single.errors;
}

}  // namespace
}  // namespace vit
