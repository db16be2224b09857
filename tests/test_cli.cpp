// The command line end to end: timm parity through `vit predict --json`, preprocessing parity on the reference
// PNGs, `vit info`, and bad inputs (each a clear one-line error naming the file and a non-zero exit status).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "data/image.h"
#include "image/decode.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace vit {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using test::data_path;

const std::string kWeights = "'" + data_path("tiny32/weights.safetensors") + "'";
const std::string kConfig = "'" + data_path("tiny32/config.json") + "'";

TEST(CliParity, PreprocessingEqualsTimmWithin1e6) {
  const auto expected = safetensors::read(data_path("tiny32/expected_tensors.safetensors"));
  const auto config = load_config(data_path("tiny32/config.json"));
  for (const std::string stem : {"synthetic", "chelsea"}) {
    const auto image = decode_image(data_path("tiny32/" + stem + ".png"));
    const auto input = preprocess(image, config.data.preprocess, 32, 32, 3);
    const double diff = test::max_abs_diff(input, expected.tensor(stem + "/input"));
    std::cout << stem << ": preprocessing max |d| " << diff << "\n";
    EXPECT_LE(diff, 1e-6) << stem;
  }
}

TEST(CliParity, PredictJsonMatchesTimmLogitsAndTop5) {
  const auto result = test::run_vit("predict --json --topk 5 --threads 1 --checkpoint " + kWeights + " --config " +
                                    kConfig + " '" + data_path("tiny32/synthetic.png") + "' '" +
                                    data_path("tiny32/chelsea.png") + "'");
  ASSERT_EQ(result.status, 0) << result.errors;
  const json out = json::parse(result.output);
  const json reference = json::parse(std::ifstream(data_path("tiny32/expected.json")));
  ASSERT_EQ(out.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const auto& expected = reference["images"][i];
    const auto& got = out[i];
    EXPECT_NE(got["image"].get<std::string>().find(expected["file"].get<std::string>()), std::string::npos);
    double logit_diff = 0, prob_diff = 0;
    for (size_t k = 0; k < 10; ++k) {
      logit_diff = std::max(logit_diff, std::abs(got["logits"][k].get<double>() - expected["logits"][k].get<double>()));
    }
    std::vector<int64_t> top;
    for (const auto& entry : got["topk"]) {
      top.push_back(entry["index"].get<int64_t>());
      prob_diff = std::max(prob_diff, std::abs(entry["prob"].get<double>() -
                                               expected["probs"][entry["index"].get<size_t>()].get<double>()));
    }
    std::cout << expected["file"] << ": logits max |d| " << logit_diff << ", probs max |d| " << prob_diff << "\n";
    EXPECT_LE(logit_diff, 1e-4);
    EXPECT_LE(prob_diff, 1e-5);
    auto expected_top = expected["top5"].get<std::vector<int64_t>>();
    if (expected["file"] == "chelsea.png" && top[2] == expected_top[3] && top[3] == expected_top[2]) {
      std::swap(top[2], top[3]);  // ranks 2 and 3 are 1.1e-4 apart: a swap is acceptable
    }
    EXPECT_EQ(top, expected_top);
  }
}

// --precision end to end: an int8 model file from `vit export`, `vit info` on it (its precision and sizes),
// `vit predict` on it in int8 by default (the same top-1 and logits close to float32's), and fp16 refused on the CPU
// in one line.
TEST(CliPrecision, Int8ExportInfoAndPredict) {
  test::TempDir dir;
  const std::string images = " '" + data_path("tiny32/synthetic.png") + "' '" + data_path("tiny32/chelsea.png") + "'";
  const std::string int8_file = dir.file("int8.safetensors");
  const auto exported = test::run_vit("export --format vit --precision int8 --checkpoint " + kWeights + " --config " +
                                      kConfig + " --out '" + int8_file + "'");
  ASSERT_EQ(exported.status, 0) << exported.errors;
  const auto info = test::run_vit("info --json --checkpoint '" + int8_file + "'");
  ASSERT_EQ(info.status, 0) << info.errors;
  const json described = json::parse(info.output);
  const bool runs_int8 = described["precision"] == "int8";  // a build without oneDNN reports float32
  if (runs_int8) {
    EXPECT_LT(described["weight_bytes"].get<double>(), 0.5 * described["weight_bytes_fp32"].get<double>());
  }
  EXPECT_LT(described["file_bytes"].get<double>(), fs::file_size(data_path("tiny32/weights.safetensors")) * 0.5);

  const auto fp32 = test::run_vit("predict --json --topk 1 --checkpoint " + kWeights + " --config " + kConfig + images);
  const auto int8 = test::run_vit("predict --json --topk 1 --checkpoint '" + int8_file + "'" + images);
  ASSERT_EQ(fp32.status, 0) << fp32.errors;
  ASSERT_EQ(int8.status, 0) << int8.errors;
  if (runs_int8) {
    EXPECT_NE(int8.errors.find("precision int8"), std::string::npos) << int8.errors;
  }
  const json a = json::parse(fp32.output), b = json::parse(int8.output);
  ASSERT_EQ(a.size(), 2u);
  double worst = 0;
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(a[i]["topk"][0]["index"], b[i]["topk"][0]["index"]);
    for (size_t k = 0; k < a[i]["logits"].size(); ++k) {
      worst = std::max(worst, std::abs(a[i]["logits"][k].get<double>() - b[i]["logits"][k].get<double>()));
    }
  }
  std::printf("vit predict, int8 file vs float32: logits max |d| %.4f\n", worst);
  EXPECT_LT(worst, 0.1);

  const auto refused = test::run_vit("predict --precision fp16 --device cpu --checkpoint '" + int8_file + "'" + images);
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.errors.find("--precision fp16 is for CUDA"), std::string::npos) << refused.errors;
}

TEST(CliInfo, PresetParameterCountsAndGmacs) {
  test::TempDir dir;
  std::ofstream(dir.file("b.json")) << R"({"model": {"preset": "vit_base_patch16_224"}})";
  const auto result = test::run_vit("info --json --config '" + dir.file("b.json") + "'");
  ASSERT_EQ(result.status, 0) << result.errors;
  const json info = json::parse(result.output);
  EXPECT_EQ(info["parameters"].get<int64_t>(), 86567656);
  EXPECT_NEAR(info["gmacs"].get<double>(), 17.57, 0.01);
  const auto table = test::run_vit("info --checkpoint " + kWeights + " --config " + kConfig);
  EXPECT_EQ(table.status, 0) << table.errors;
  EXPECT_NE(table.output.find("parameters  150346"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("blocks.1.mlp.fc2"), std::string::npos);
}

class CliBadImages : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(dir.file("empty.jpg"));
    std::ofstream(dir.file("text.jpg")) << "this is not a JPEG\n";
    const std::string png = test::data_path("tiny32/chelsea.png");
    std::ifstream in(png, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(dir.file("truncated.png"), std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    fs::copy_file(png, dir.file("good.png"));
  }
  test::TempDir dir;
};

TEST_F(CliBadImages, EachGetsAnErrorEntryOthersAreStillClassified) {
  const auto result = test::run_vit("predict --json --checkpoint " + kWeights + " --config " + kConfig + " '" +
                                    dir.path() + "'");
  EXPECT_EQ(result.status, 3) << result.errors;
  const json out = json::parse(result.output);
  ASSERT_EQ(out.size(), 4u);
  int errors = 0, classified = 0;
  for (const auto& entry : out) {
    if (entry.contains("error")) {
      ++errors;
      const std::string message = entry["error"];
      EXPECT_EQ(message.find('\n'), std::string::npos);
      EXPECT_EQ(message.rfind(entry["image"].get<std::string>(), 0), 0u) << message;  // starts with the path
    } else {
      ++classified;
      EXPECT_NE(entry["image"].get<std::string>().find("good.png"), std::string::npos);
    }
  }
  EXPECT_EQ(errors, 3);
  EXPECT_EQ(classified, 1);
  EXPECT_NE(result.errors.find("empty.jpg"), std::string::npos);
  EXPECT_NE(result.errors.find("truncated.png"), std::string::npos);
  EXPECT_NE(result.errors.find("text.jpg"), std::string::npos);
}

class CliBadFiles : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::string write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir.file(name), std::ios::binary) << bytes;
    return dir.file(name);
  }
  test::CommandResult predict_with(const std::string& model) {
    return test::run_vit("predict --checkpoint '" + model + "' --config " + kConfig + " '" +
                         data_path("tiny32/chelsea.png") + "'");
  }
  static std::string reference_bytes() {
    std::ifstream in(data_path("tiny32/weights.safetensors"), std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
};

TEST_F(CliBadFiles, TruncatedSafetensors) {
  const auto bytes = reference_bytes();
  const auto path = write("truncated.safetensors", bytes.substr(0, bytes.size() - 1000));
  const auto result = predict_with(path);
  EXPECT_EQ(result.status, 1);
  EXPECT_NE(result.errors.find(path + ":"), std::string::npos) << result.errors;
}

TEST_F(CliBadFiles, HeaderLengthBeyondFile) {
  auto bytes = reference_bytes();
  const uint64_t huge = bytes.size() + 100;
  std::memcpy(bytes.data(), &huge, 8);
  const auto path = write("header.safetensors", bytes);
  const auto result = predict_with(path);
  EXPECT_EQ(result.status, 1);
  EXPECT_NE(result.errors.find(path + ": header length"), std::string::npos) << result.errors;
}

TEST_F(CliBadFiles, OffsetsOutOfRange) {
  auto bytes = reference_bytes();
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  std::string header = bytes.substr(8, header_length);
  auto j = json::parse(header);
  auto& offsets = j["head.bias"]["data_offsets"];
  offsets[1] = offsets[1].get<uint64_t>() + 10000000;
  std::string patched = j.dump();
  patched.resize(((patched.size() + 7) / 8) * 8, ' ');
  const uint64_t new_length = patched.size();
  std::string out(reinterpret_cast<const char*>(&new_length), 8);
  out += patched + bytes.substr(8 + header_length);
  const auto path = write("offsets.safetensors", out);
  const auto result = predict_with(path);
  EXPECT_EQ(result.status, 1);
  EXPECT_NE(result.errors.find(path + ":"), std::string::npos) << result.errors;
  EXPECT_NE(result.errors.find("head.bias"), std::string::npos) << result.errors;
}

TEST_F(CliBadFiles, UnknownConfigKeyAndWrongType) {
  const auto unknown = write("unknown.json", R"({"model": {"dpeth": 3}})");
  auto result = test::run_vit("info --config '" + unknown + "'");
  EXPECT_EQ(result.status, 2);
  EXPECT_NE(result.errors.find(unknown + ": model.dpeth: unknown key"), std::string::npos) << result.errors;
  const auto wrong = write("wrong.json", R"({"model": {"depth": "six"}})");
  result = test::run_vit("info --config '" + wrong + "'");
  EXPECT_EQ(result.status, 2);
  EXPECT_NE(result.errors.find(wrong + ": model.depth: \"six\" is not an integer"), std::string::npos)
      << result.errors;
  result = test::run_vit("info --config " + kConfig + " --set model.num_heads=5");
  EXPECT_EQ(result.status, 2);
  EXPECT_NE(result.errors.find("model.num_heads: 5 does not divide embed_dim 64"), std::string::npos)
      << result.errors;
}

TEST_F(CliBadFiles, MissingCheckpointAndBadFlags) {
  auto result = test::run_vit("predict --checkpoint '" + dir.file("nope.safetensors") + "' x.png");
  EXPECT_EQ(result.status, 2);
  result = test::run_vit("predict --topk 0 --checkpoint " + kWeights + " x.png");
  EXPECT_EQ(result.status, 2);
  result = test::run_vit("frobnicate");
  EXPECT_EQ(result.status, 2);
}

// Each bad command-line input fails alone, named, while the good ones are classified; nothing waits on a FIFO or
// reads /dev/zero forever; limits refuse big files and bombs undecoded; names are escaped in text and JSON output.
TEST(CliHostileInputs, EachBadInputFailsAloneAndTheRestAreClassified) {
  test::TempDir dir;
  const std::string good = data_path("tiny32/chelsea.png");
  const std::string fifo = dir.file("pipe.jpg");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string zero = dir.file("zero.jpg");
  fs::create_symlink("/dev/zero", zero);
  const std::string folder = dir.file("folder.jpg");  // a directory named like an image, with nothing in it
  fs::create_directory(folder);
  const std::string missing = dir.file("missing.png");
  const std::string big = dir.file("big.png");
  test::write_bytes(big, std::string(2 << 20, 'x'));  // 2 MiB, over --max-file-mb 1
  const std::string bomb = dir.file("bomb.png");      // a header declaring 5e9 pixels
  auto be32 = [](uint32_t v) {
    return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                       static_cast<char>(v)};
  };
  test::write_bytes(bomb, std::string("\x89PNG\r\n\x1a\n", 8) + be32(13) + "IHDR" + be32(100000) + be32(50000) +
                              std::string("\x08\x02\0\0\0", 5) + be32(0) + be32(0) + "IEND" + be32(0));
  const std::string evil = dir.file("evil\x1b[31m\xff.png");  // a control sequence and a byte that is not UTF-8
  test::write_bytes(evil, "not an image");

  const std::string inputs = "'" + fifo + "' '" + good + "' '" + zero + "' '" + folder + "' '" + missing + "' '" +
                             big + "' '" + bomb + "' '" + evil + "'";
  const std::string base = "predict --threads 1 --checkpoint " + kWeights + " --config " + kConfig;
  const std::string command = base + " --max-file-mb 1";
  const auto result = test::run_vit(command + " " + inputs);
  EXPECT_EQ(result.status, 3) << result.errors;
  EXPECT_NE(result.output.find(good + ": "), std::string::npos) << result.output;
  const std::pair<std::string, std::string> errors[] = {
      {fifo, "is a FIFO (named pipe), not a regular file"},
      {zero, "is a character device, not a regular file"},
      {folder, "is a directory with no image files in it"},
      {missing, "cannot open for reading: No such file or directory"},
      {big, "2097152 bytes is over the limit of 1048576 bytes for this file"},
      {bomb, "PNG of 100000x50000 is 5000000000 pixels, over the limit of 178956970"},
      {dir.file("evil\\x1b[31m\\xff.png"), "not an image format vit decodes"}};
  for (const auto& [path, phrase] : errors) {
    EXPECT_NE(result.output.find(path + ": error: " + path + ": " + phrase), std::string::npos)
        << path << ": " << phrase << "\n" << result.output;
  }
  EXPECT_EQ(result.output.find('\x1b'), std::string::npos) << "a raw escape byte reached stdout";
  EXPECT_EQ(result.errors.find('\x1b'), std::string::npos) << "a raw escape byte reached stderr";

  // JSON stays valid UTF-8 with such a name in it.
  const auto as_json = test::run_vit(command + " --json '" + good + "' '" + evil + "'");
  EXPECT_EQ(as_json.status, 3) << as_json.errors;
  const json report = json::parse(as_json.output);
  ASSERT_EQ(report.size(), 2u);
  const json& failed = report[0].contains("error") ? report[0] : report[1];  // a batch's errors come first
  EXPECT_EQ(failed["image"], dir.file("evil\\x1b[31m\\xff.png"));

  // All inputs failed: a runtime error, not a partial success. A raised limit lets the big file through (to fail as
  // what it is: not an image).
  const auto none = test::run_vit(command + " '" + missing + "' '" + folder + "'");
  EXPECT_EQ(none.status, 1) << none.errors;
  const auto raised = test::run_vit(base + " --max-file-mb 4 '" + big + "'");
  EXPECT_NE(raised.output.find(big + ": error: " + big + ": not an image format vit decodes"), std::string::npos)
      << raised.output;

  // embed and export-attention share the inputs path and its exit statuses.
  const std::string model = " --threads 1 --checkpoint " + kWeights + " --config " + kConfig;
  const auto embedded = test::run_vit("embed" + model + " --out '" + dir.file("features") + "' '" + good + "' '" +
                                      fifo + "'");
  EXPECT_EQ(embedded.status, 3) << embedded.errors;
  EXPECT_NE(embedded.errors.find(fifo + ": is a FIFO (named pipe), not a regular file"), std::string::npos)
      << embedded.errors;
  const auto exported = test::run_vit("export-attention" + model + " --out '" + dir.file("maps") + "' '" + zero + "'");
  EXPECT_EQ(exported.status, 1) << exported.errors;
  EXPECT_NE(exported.output.find(zero + ": error: " + zero + ": is a character device"), std::string::npos)
      << exported.output;
}

}  // namespace
}  // namespace vit
