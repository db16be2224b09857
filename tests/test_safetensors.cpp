// The safetensors reader and writer (src/io/safetensors.h): round trips must be bit-identical, timm's reference file
// reads with its values, and every kind of damaged file must fail with one line naming the file.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "test_util.h"
#include "util/fs.h"

namespace {
namespace st = vit::safetensors;
using vit::test::TempDir;
using vit::test::error_of;

// A safetensors file from a hand-written header, for the cases our own writer would never produce.
std::string make_file(const std::string& header, const std::string& data) {
  const uint64_t length = header.size();
  std::string out(reinterpret_cast<const char*>(&length), sizeof length);
  return out + header + data;
}

std::string raw_bytes(const torch::Tensor& tensor) {
  const torch::Tensor contiguous = tensor.contiguous();
  return std::string(static_cast<const char*>(contiguous.data_ptr()), contiguous.numel() * contiguous.element_size());
}

// Parses `bytes` as file `name` and returns the error; the message must be one line starting with the name.
std::string parse_error(const std::string& bytes, const std::string& name = "damaged.safetensors") {
  const std::string message = error_of([&] { st::parse(bytes, name); });
  EXPECT_NE(message, "(no error)") << "parse accepted a damaged file";
  EXPECT_EQ(message.rfind(name + ": ", 0), 0u) << "message does not start with the path: " << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << "message is not one line: " << message;
  return message;
}

TEST(SafetensorsRoundTrip, AllDtypesBitIdenticalWithMetadata) {
  TempDir dir;
  torch::manual_seed(0);
  const st::NamedTensors tensors = {
      {"z.first", torch::randn({3, 4})},  // not alphabetical: the header must keep the given order
      {"half", torch::randn({2, 5}).to(torch::kFloat16)},
      {"bfloat", torch::randn({7}).to(torch::kBFloat16)},
      {"double", torch::randn({2, 2, 2}, torch::kFloat64)},
      {"long", torch::arange(-5, 5, torch::kInt64).reshape({2, 5})},
      {"int", torch::tensor({INT32_MIN, -1, 0, INT32_MAX}, torch::kInt32)},
      {"byte", torch::arange(0, 256, torch::kInt64).to(torch::kUInt8)},
      {"flags", torch::tensor({true, false, true})},
      {"scalar", torch::tensor(3.5f)},
      {"empty", torch::zeros({0, 4})},
      {"transposed", torch::arange(12, torch::kFloat32).reshape({3, 4}).t()},  // written contiguous
  };
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "round trip"}};
  const std::string path = dir.file("all.safetensors");
  st::write(path, tensors, metadata);

  const std::string bytes = vit::read_file(path);
  EXPECT_EQ(bytes, st::serialize(tensors, metadata));
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  EXPECT_EQ(header_length % 8, 0u) << "header not padded to a multiple of 8";

  const st::Archive archive = st::read(path);
  EXPECT_EQ(archive.path, path);
  EXPECT_EQ(archive.metadata, metadata);
  ASSERT_EQ(archive.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, expected] = tensors[i];
    EXPECT_EQ(archive.tensors[i].name, name) << "header order changed";
    const torch::Tensor loaded = archive.tensor(archive.tensors[i], /*as_float32=*/false);
    EXPECT_EQ(loaded.scalar_type(), expected.scalar_type()) << name;
    EXPECT_EQ(loaded.sizes(), expected.sizes()) << name;
    EXPECT_EQ(raw_bytes(loaded), raw_bytes(expected)) << name << " is not bit-identical";
  }
  EXPECT_EQ(archive.find("missing"), nullptr);
  EXPECT_NE(archive.find("half"), nullptr);
}

TEST(SafetensorsRoundTrip, TensorsOwnTheirMemory) {
  const torch::Tensor original = torch::arange(6, torch::kFloat32);
  st::Archive archive = st::parse(st::serialize({{"x", original}}), "memory.safetensors");
  const torch::Tensor loaded = archive.tensor("x");
  std::fill(archive.bytes.begin(), archive.bytes.end(), '\0');
  archive = st::Archive{};
  EXPECT_TRUE(torch::equal(loaded, original));
}

TEST(SafetensorsRoundTrip, WriterRejectsWhatTheFormatCannotHold) {
  EXPECT_NE(error_of([] {
              st::serialize({{"a", torch::zeros({2})}, {"a", torch::zeros({2})}});
            }).find("'a'"),
            std::string::npos);
  EXPECT_NE(error_of([] { st::serialize({{"__metadata__", torch::zeros({2})}}); }).find("reserved"), std::string::npos);
  EXPECT_NE(error_of([] {
              st::serialize({{"short", torch::zeros({2}, torch::kInt16)}});
            }).find("Short"),
            std::string::npos);
  EXPECT_NE(error_of([] { st::serialize({{"undefined", torch::Tensor()}}); }).find("undefined"), std::string::npos);

  TempDir dir;
  const std::string path = dir.file("no_such_dir/out.safetensors");
  EXPECT_NE(error_of([&] { st::write(path, {{"x", torch::zeros({2})}}); }).find(path), std::string::npos);
}

TEST(SafetensorsReference, ReadsTimmTinyWeights) {
  const std::string path = VIT_TEST_DATA "/tiny32/weights.safetensors";
  const st::Archive archive = st::read(path);
  EXPECT_EQ(archive.metadata.at("format"), "pt");
  ASSERT_EQ(archive.tensors.size(), 32u);
  EXPECT_EQ(archive.tensors.front().name, "cls_token");
  EXPECT_EQ(archive.tensors.back().name, "head.bias");

  const std::map<std::string, std::vector<int64_t>> shapes = {
      {"cls_token", {1, 1, 64}},
      {"pos_embed", {1, 5, 64}},
      {"patch_embed.proj.weight", {64, 3, 16, 16}},
      {"patch_embed.proj.bias", {64}},
      {"blocks.1.attn.qkv.weight", {192, 64}},
      {"blocks.0.mlp.fc1.weight", {256, 64}},
      {"norm.weight", {64}},
      {"head.weight", {10, 64}},
      {"head.bias", {10}},
  };
  for (const auto& [name, shape] : shapes) {
    const st::TensorInfo* info = archive.find(name);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_EQ(info->dtype, st::DType::F32) << name;
    EXPECT_EQ(info->shape, shape) << name;
    EXPECT_EQ(archive.tensor(*info).sizes().vec(), shape) << name;
  }
  // Values read independently from the file with Python's struct module.
  const torch::Tensor cls_token = archive.tensor("cls_token").flatten();
  EXPECT_FLOAT_EQ(cls_token[0].item<float>(), -0.05629199370741844f);
  EXPECT_FLOAT_EQ(cls_token[2].item<float>(), -0.012528928928077221f);
  const torch::Tensor head_bias = archive.tensor("head.bias");
  EXPECT_FLOAT_EQ(head_bias[0].item<float>(), 0.048509564250707626f);
  EXPECT_FLOAT_EQ(head_bias[1].item<float>(), 0.014964379370212555f);
}

TEST(SafetensorsConvert, HalfAndBfloat16BecomeExactFloat32) {
  // Hand-written bit patterns, so the check does not rely on torch's own conversion in both directions.
  const uint16_t half_bits[] = {0x3C00, 0xC000, 0x7BFF, 0x3555};    // 1, -2, 65504, 0.333251953125
  const uint16_t bfloat_bits[] = {0x3F80, 0xC020, 0x4049, 0x7F7F};  // 1, -2.5, 3.140625, 3.3895314e38
  const std::string data = std::string(reinterpret_cast<const char*>(half_bits), sizeof half_bits) +
                           std::string(reinterpret_cast<const char*>(bfloat_bits), sizeof bfloat_bits) +
                           std::string("\x00\x01\x02", 3);
  const std::string header = R"({"h": {"dtype": "F16", "shape": [2, 2], "data_offsets": [0, 8]},)"
                             R"( "b": {"dtype": "BF16", "shape": [4], "data_offsets": [8, 16]},)"
                             R"( "flags": {"dtype": "BOOL", "shape": [3], "data_offsets": [16, 19]}})"
                             "     ";  // trailing padding spaces are allowed
  const st::Archive archive = st::parse(make_file(header, data), "convert.safetensors");

  const torch::Tensor half = archive.tensor("h");
  EXPECT_EQ(half.scalar_type(), torch::kFloat32);
  EXPECT_EQ(half.sizes(), torch::IntArrayRef({2, 2}));
  EXPECT_TRUE(torch::equal(half.flatten(), torch::tensor({1.0f, -2.0f, 65504.0f, 0.333251953125f})));
  EXPECT_EQ(archive.tensor("h", /*as_float32=*/false).scalar_type(), torch::kFloat16);

  const torch::Tensor bfloat = archive.tensor("b");
  EXPECT_EQ(bfloat.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(bfloat, torch::tensor({1.0f, -2.5f, 3.140625f, 3.3895313892515355e38f})));

  // Any non-zero byte is true; torch's bool must only ever hold 0 or 1.
  const torch::Tensor flags = archive.tensor("flags");
  EXPECT_EQ(flags.scalar_type(), torch::kBool);
  EXPECT_TRUE(torch::equal(flags, torch::tensor({false, true, true})));
}

TEST(SafetensorsCorrupt, EachDamageNamesTheFileAndValues) {
  const std::string good = st::serialize({{"w", torch::ones({2, 3})}});
  ASSERT_NO_THROW(st::parse(good, "good.safetensors"));

  EXPECT_NE(parse_error(std::string("abc")).find("3 bytes"), std::string::npos);

  std::string truncated = good.substr(0, good.size() - 4);
  EXPECT_NE(parse_error(truncated).find("beyond the data section size 20"), std::string::npos);

  std::string beyond = good;
  const uint64_t too_long = good.size();
  std::memcpy(&beyond[0], &too_long, 8);
  EXPECT_NE(parse_error(beyond).find("header length " + std::to_string(too_long) + " exceeds file size " +
                                     std::to_string(good.size())),
            std::string::npos);

  std::string absurd = good;
  const uint64_t huge = uint64_t{1} << 40;
  std::memcpy(&absurd[0], &huge, 8);
  EXPECT_NE(parse_error(absurd).find("exceeds the limit"), std::string::npos);

  // Hand-written headers over 24 data bytes, each wrong in one way.
  const auto expect_header_error = [](const std::string& header, const std::string& phrase) {
    const std::string message = parse_error(make_file(header, std::string(24, '\0')));
    EXPECT_NE(message.find(phrase), std::string::npos) << header << "\n" << message;
  };
  expect_header_error(R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 48]}})",
                      "data_offsets end 48 is beyond the data section size 24");
  expect_header_error("{\"w\": {\"dtype\": \"F32\",\n bad json", "not valid JSON");
  expect_header_error("[1, 2]", "expected an object");
  expect_header_error(R"({"w": {"dtype": "I16", "shape": [12], "data_offsets": [0, 24]}})",
                      "unsupported dtype 'I16'");
  expect_header_error(R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})",
                      "shape [2, 3] of F32 needs 24 bytes but data_offsets [0, 20] hold 20");
  expect_header_error(R"({"w": {"dtype": "F32", "shape": [2, -3], "data_offsets": [0, 24]}})", "negative (-3)");
  expect_header_error(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", "begin > end");
  expect_header_error(R"({"w": {"shape": [6], "data_offsets": [0, 24]}})", "missing \"dtype\"");
  expect_header_error(R"({"w": {"dtype": "F32", "shape": "6", "data_offsets": [0, 24]}})",
                      "\"shape\" is a JSON string");
  expect_header_error(R"({"w": {"dtype": "F32", "shape": [6], "data_offsets": [0]}})", "data_offsets");
  expect_header_error(R"({"__metadata__": {"epoch": 3}})", "value for 'epoch'");
  // Control characters in a name must not break the one-line message.
  expect_header_error("{\"bad\\nname\": {\"dtype\": \"X\", \"shape\": [], \"data_offsets\": [0, 0]}}",
                      "'bad\\nname'");
}

TEST(SafetensorsCorrupt, ReadNamesThePathOnDisk) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  vit::write_file_atomic(path, "tiny");
  const std::string message = error_of([&] { st::read(path); });
  EXPECT_EQ(message.rfind(path + ": file is 4 bytes", 0), 0u) << message;
  const std::string missing = dir.file("absent.safetensors");
  EXPECT_NE(error_of([&] { st::read(missing); }).find(missing), std::string::npos);
}

TEST(SafetensorsFile, ReadsLikeArchiveAndIntoDestinations) {
  TempDir dir;
  torch::manual_seed(1);
  const st::NamedTensors tensors = {
      {"w", torch::randn({3, 4})},
      {"half", torch::randn({2, 5}).to(torch::kFloat16)},
      {"flags", torch::tensor({true, false, true})},
      {"empty", torch::zeros({0, 4})},
  };
  const std::string path = dir.file("m.safetensors");
  st::write(path, tensors, {{"note", "x"}});
  const st::Archive archive = st::read(path);
  const st::File file(path);
  EXPECT_EQ(file.path(), path);
  EXPECT_EQ(file.metadata(), archive.metadata);
  ASSERT_EQ(file.tensors().size(), tensors.size());
  for (const auto& info : file.tensors()) {
    EXPECT_EQ(raw_bytes(file.tensor(info, false)), raw_bytes(archive.tensor(info, false))) << info.name;
    EXPECT_TRUE(torch::equal(file.tensor(info), archive.tensor(info))) << info.name;
  }
  EXPECT_EQ(file.find("absent"), nullptr);

  // Straight into a float32 destination, into one of another dtype, and into a non-contiguous view.
  auto direct = torch::empty({3, 4});
  file.read_into(*file.find("w"), direct);
  EXPECT_TRUE(torch::equal(direct, tensors[0].second));
  auto widened = torch::empty({2, 5}, torch::kFloat64);
  file.read_into(*file.find("half"), widened);
  EXPECT_TRUE(torch::equal(widened, tensors[1].second.to(torch::kFloat64)));
  auto transposed = torch::empty({4, 3}).t();
  file.read_into(*file.find("w"), transposed);
  EXPECT_TRUE(torch::equal(transposed, tensors[0].second));
  auto flags = torch::empty({3}, torch::kBool);
  file.read_into(*file.find("flags"), flags);
  EXPECT_TRUE(torch::equal(flags, tensors[2].second));

  auto wrong = torch::empty({4, 3});
  const std::string message = error_of([&] { file.read_into(*file.find("w"), wrong); });
  EXPECT_EQ(message.rfind(path + ": tensor 'w' has shape [3, 4], the destination has [4, 3]", 0), 0u) << message;
}

TEST(SafetensorsFile, KeepsReadingTheFileItOpened) {
  TempDir dir;
  const std::string path = dir.file("best.safetensors");
  st::write(path, {{"w", torch::full({64}, 1.0f)}});
  const st::File file(path);
  // A training run replaces the file (atomic rename) between the header and the data: the open file still wins.
  st::write(path, {{"other", torch::zeros({2})}, {"w", torch::full({64}, 2.0f)}});
  auto out = torch::empty({64});
  file.read_into(*file.find("w"), out);
  EXPECT_TRUE(torch::equal(out, torch::full({64}, 1.0f)));
}

TEST(SafetensorsFile, DamageNamesTheFile) {
  TempDir dir;
  const std::string good = st::serialize({{"w", torch::ones({2, 3})}});
  const std::string truncated = dir.file("truncated.safetensors");
  vit::write_file_atomic(truncated, good.substr(0, good.size() - 4));
  std::string message = error_of([&] { st::File file(truncated); });
  EXPECT_EQ(message.rfind(truncated + ": ", 0), 0u) << message;
  EXPECT_NE(message.find("beyond the data section size 20"), std::string::npos) << message;

  const std::string tiny = dir.file("tiny.safetensors");
  vit::write_file_atomic(tiny, "tiny");
  EXPECT_EQ(error_of([&] { st::File file(tiny); }).rfind(tiny + ": file is 4 bytes", 0), 0u);
  const std::string missing = dir.file("absent.safetensors");
  EXPECT_EQ(error_of([&] { st::File file(missing); }).rfind(missing + ": cannot open", 0), 0u);
  EXPECT_EQ(error_of([&] { st::File file(dir.path()); }).rfind(dir.path() + ": not a regular file", 0), 0u);

  // Shortened after it was opened: the read fails with the file's name instead of returning garbage.
  const std::string shrinking = dir.file("shrinking.safetensors");
  vit::write_file_atomic(shrinking, good);
  const st::File file(shrinking);
  ASSERT_EQ(::truncate(shrinking.c_str(), static_cast<off_t>(good.size() - 4)), 0);
  auto out = torch::empty({2, 3});
  message = error_of([&] { file.read_into(*file.find("w"), out); });
  EXPECT_EQ(message.rfind(shrinking + ": file ended while reading tensor 'w'", 0), 0u) << message;
}

}  // namespace
