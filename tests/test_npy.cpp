// The .npy writer and reader (src/io/npy.h): numpy's exact header, 64-byte alignment, round trips, refusals by
// name, and numpy itself loading our files and saving the same bytes.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "io/npy.h"
#include "test_util.h"
#include "util/fs.h"

namespace {
using vit::test::TempDir;
using vit::test::error_of;

TEST(NpyFormat, ExactHeaderForKnownShapes) {
  // numpy.save's output for float32 arrays of these shapes, header length 118 (preamble 128 bytes).
  const std::map<std::vector<int64_t>, std::string> headers = {
      {{2, 3}, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"},
      {{5}, "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }"},
      {{}, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }"},
  };
  for (const auto& [shape, dict] : headers) {
    const std::string bytes = vit::npy_bytes(torch::zeros(shape));
    std::string expected = std::string("\x93NUMPY\x01\x00\x76\x00", 10) + dict;
    expected.append(127 - expected.size(), ' ');
    expected += '\n';
    ASSERT_GE(bytes.size(), 128u);
    EXPECT_EQ(bytes.substr(0, 128), expected);
    int64_t count = 1;
    for (int64_t dim : shape) count *= dim;
    EXPECT_EQ(bytes.size(), 128u + 4 * count);
  }
}

TEST(NpyFormat, PreambleIs64ByteAlignedAndParsesBack) {
  TempDir dir;
  torch::manual_seed(1);
  const std::vector<std::vector<int64_t>> shapes = {
      {}, {1}, {7}, {3, 4}, {2, 3, 4}, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, {123456789, 0}, {0}};
  for (const auto& shape : shapes) {
    const torch::Tensor tensor = torch::randn(shape);
    const std::string bytes = vit::npy_bytes(tensor);
    uint16_t header_length = 0;
    std::memcpy(&header_length, bytes.data() + 8, 2);
    EXPECT_EQ((10 + header_length) % 64, 0u) << "shape of rank " << shape.size();
    EXPECT_EQ(bytes[10 + header_length - 1], '\n');

    const std::string path = dir.file("a.npy");
    vit::write_npy(path, tensor);
    const torch::Tensor loaded = vit::read_npy(path);
    EXPECT_EQ(loaded.sizes(), tensor.sizes());
    EXPECT_TRUE(torch::equal(loaded, tensor));
  }
  // Non-contiguous input is written in logical (C) order.
  const torch::Tensor transposed = torch::arange(6, torch::kFloat32).reshape({2, 3}).t();
  vit::write_npy(dir.file("t.npy"), transposed);
  EXPECT_TRUE(torch::equal(vit::read_npy(dir.file("t.npy")), transposed));
}

TEST(NpyFormat, RejectsWhatItCannotWriteOrRead) {
  TempDir dir;
  const std::string path = dir.file("double.npy");
  EXPECT_NE(error_of([&] { vit::write_npy(path, torch::zeros({2}, torch::kFloat64)); }).find(path), std::string::npos);

  // A '<f8' file as numpy writes it: the reader must refuse it by name, not misread it.
  std::string f8 = vit::npy_bytes(torch::zeros({2}));
  f8.replace(f8.find("<f4"), 3, "<f8");
  vit::write_file_atomic(path, f8 + std::string(8, '\0'));
  std::string message = error_of([&] { vit::read_npy(path); });
  EXPECT_EQ(message.rfind(path + ": ", 0), 0u) << message;
  EXPECT_NE(message.find("'<f4'"), std::string::npos) << message;

  std::string fortran = vit::npy_bytes(torch::zeros({2, 2}));
  fortran.replace(fortran.find("False"), 5, "True ");
  vit::write_file_atomic(path, fortran);
  EXPECT_NE(error_of([&] { vit::read_npy(path); }).find("Fortran"), std::string::npos);

  const std::string short_data = vit::npy_bytes(torch::zeros({4}));
  vit::write_file_atomic(path, short_data.substr(0, short_data.size() - 4));
  EXPECT_NE(error_of([&] { vit::read_npy(path); }).find("npy data is 12 bytes"), std::string::npos);

  vit::write_file_atomic(path, "not numpy at all");
  EXPECT_NE(error_of([&] { vit::read_npy(path); }).find(path + ": not a .npy file"), std::string::npos);
}

TEST(NpyNumpy, NumpyLoadsOurFilesAndSavesTheSameBytes) {
  SKIP_WITHOUT_PYTHON("numpy");
  TempDir dir;
  // numpy checks dtype, shape and values, then saves each array again; the bytes must equal ours.
  const std::vector<std::pair<std::vector<int64_t>, std::string>> cases = {
      {{2, 3, 4}, "2,3,4"}, {{5}, "5"}, {{}, ""}, {{3, 0}, "3,0"}};
  std::string arguments = "roundtrip";
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& [shape, shape_argument] = cases[i];
    const torch::Tensor tensor = (torch::arange(c10::multiply_integers(shape), torch::kFloat32) * 0.5).reshape(shape);
    vit::write_npy(dir.file("ours" + std::to_string(i) + ".npy"), tensor);
    arguments += " " + vit::test::quoted(dir.file("ours" + std::to_string(i) + ".npy") + ":" +
                                         dir.file("theirs" + std::to_string(i) + ".npy") + ":" + shape_argument);
  }
  vit::test::run_python("reference_numpy.py", arguments);
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(vit::read_file(dir.file("theirs" + std::to_string(i) + ".npy")),
              vit::read_file(dir.file("ours" + std::to_string(i) + ".npy")))
        << "numpy.save differs for shape (" << cases[i].second << ")";
  }
}

}  // namespace
