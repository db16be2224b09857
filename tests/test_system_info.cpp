// `vit info --system` (model/system_info.h), and the instruction-set caps that the matrix of tests/CMakeLists.txt
// runs the kernel tests under: each cap the environment sets must have taken effect, and int8 must take the path the
// capped instruction set calls for.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "model/precision.h"
#include "model/row_kernels.h"
#include "model/system_info.h"
#include "vit/build_config.h"

#if VIT_WITH_DNNL
#include "model/dnnl_matmul.h"
#endif

namespace vit {
namespace {

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

#if VIT_WITH_DNNL
// oneDNN's x86 instruction sets in order; -1 for a name outside them.
int isa_rank(const std::string& name) {
  const char* order[] = {"sse41",       "avx",         "avx2",           "avx2_vnni",
                         "avx512_core", "avx512_core_vnni", "avx512_core_bf16", "avx512_core_amx"};
  for (int i = 0; i < 8; ++i) {
    if (name == order[i]) return i;
  }
  return -1;
}
#endif

TEST(SystemInfo, DescribesThisMachineAndTheCapsTakeEffect) {
  const auto info = describe_system();
  const std::string text = to_text(info);
  std::printf("%s", text.c_str());
  EXPECT_FALSE(info.cpu.empty());
  EXPECT_NE(info.vit_kernels.find(row_kernels().isa), std::string::npos);
  ASSERT_EQ(info.precisions.size(), 4u);
  for (const char* line : {"cpu ", "vit kernels ", "oneDNN ", "LibTorch ", "precision    int8: ", "CUDA "}) {
    EXPECT_NE(text.find(line), std::string::npos) << line;
  }
  const auto json = to_json(info);
  for (const char* key : {"cpu", "instructions", "vit_kernels", "onednn", "libtorch", "precisions", "cuda_devices"}) {
    EXPECT_TRUE(json.contains(key)) << key;
  }
  EXPECT_TRUE(json["precisions"].contains("int8"));
  EXPECT_EQ(info.precisions[1].second, precision_kernel(Precision::int8));

  if (const char* cap = std::getenv("VIT_CPU_ISA"); cap != nullptr && *cap != '\0') {
    EXPECT_EQ(std::string(row_kernels().isa), cap);
  }
  if (const char* cap = std::getenv("ATEN_CPU_CAPABILITY"); cap != nullptr && *cap != '\0') {
    // LibTorch 1.13 calls its default level "NO AVX", 2.x "DEFAULT".
    const std::string level = lower(cap);
    const bool named = level == "default" ? info.libtorch.find("its kernels NO AVX") != std::string::npos ||
                                                info.libtorch.find("its kernels DEFAULT") != std::string::npos
                                          : info.libtorch.find(level == "avx2" ? "its kernels AVX2," : "its kernels AVX512,") !=
                                                std::string::npos;
    EXPECT_TRUE(named) << info.libtorch;
  }
#if VIT_WITH_DNNL
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (cap == nullptr) cap = std::getenv("DNNL_MAX_CPU_ISA");
  if (cap != nullptr && *cap != '\0' && lower(cap) != "all") {
    ASSERT_GE(isa_rank(lower(cap)), 0) << "an ONEDNN_MAX_CPU_ISA this test does not know: " << cap;
    EXPECT_LE(isa_rank(dnnl_cpu_isa()), isa_rank(lower(cap))) << dnnl_cpu_isa();
  }
  // int8's path follows the instruction set oneDNN runs, not CPUID: below VNNI, vit's own kernel, at 7 bits where it
  // sums pairs in 16.
  const std::string isa = dnnl_cpu_isa();
  if (isa_rank(isa) >= 0 && (isa_rank(isa) < isa_rank("avx2_vnni") || isa == "avx512_core")) {
    EXPECT_FALSE(int8_path().onednn);
    EXPECT_EQ(int8_path().weight_max, row_kernels().int8_pairs_in_16_bits ? 63 : 127);
    EXPECT_FALSE(dnnl_has_bf16());
    EXPECT_FALSE(precision_refusal(Precision::bf16, torch::kCPU).empty());
  }
  if (isa_rank(isa) >= isa_rank("avx512_core_vnni")) {
    EXPECT_TRUE(int8_path().onednn) << isa;
  }
#endif
  std::printf("paths: %s\n", cpu_paths_line().c_str());
}

}  // namespace
}  // namespace vit
