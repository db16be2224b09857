// model/system_info.h: the CPU from /proc/cpuinfo, the paths from the units that choose them.
#include "model/system_info.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "model/cpu_kernels.h"
#include "model/fused_block.h"
#include "model/precision.h"
#include "model/row_kernels.h"
#include "vit/build_config.h"

#if VIT_WITH_DNNL
#include "model/dnnl_matmul.h"
#endif
#if VIT_WITH_CUDA_STATS
#include <cuda_runtime_api.h>
#endif

namespace vit {
namespace {

// The variables that change which kernels run: vit's own, oneDNN's, LibTorch's dispatch and its BLAS, OpenMP.
constexpr const char* kSteering[] = {"VIT_CPU_ISA",        "VIT_CPU_KERNELS",         "VIT_FUSED_BLOCK",
                                     "VIT_PACKED_PRODUCTS", "VIT_ONE_REGION",          "ONEDNN_MAX_CPU_ISA",
                                     "DNNL_MAX_CPU_ISA",    "ATEN_CPU_CAPABILITY",     "MKL_ENABLE_INSTRUCTIONS",
                                     "OPENBLAS_CORETYPE",   "OMP_NUM_THREADS"};

// The instruction sets some path of vit's depends on, in /proc/cpuinfo's names (x86 "flags", Arm "Features").
const std::set<std::string> kRelevantFlags = {
    "sse4_2",      "avx",         "avx2",     "fma",      "f16c",      "avx512f",  "avx512bw",  "avx512vl",
    "avx512dq",    "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16", "avx512_fp16",
    "asimd",       "asimddp",     "i8mm",     "bf16",     "sve",       "sve2"};

// /proc/cpuinfo's first "key : value" line for key, or "".
std::string cpuinfo_value(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    while (!name.empty() && (name.back() == ' ' || name.back() == '\t')) name.pop_back();
    if (name == key) return colon + 2 <= line.size() ? line.substr(colon + 2) : "";
  }
  return "";
}

std::string architecture() {
#if defined(__x86_64__)
  return "x86_64";
#elif defined(__aarch64__)
  return "aarch64";
#else
  return "other";
#endif
}

// LibTorch's own kernels' instruction set, as its configuration summary names it ("CPU capability usage: AVX2").
std::string aten_capability() {
  const std::string config = at::show_config();
  const std::string key = "CPU capability usage: ";
  const auto at = config.find(key);
  if (at == std::string::npos) return "unknown";
  const auto end = config.find('\n', at);
  return config.substr(at + key.size(), end == std::string::npos ? std::string::npos : end - at - key.size());
}

std::vector<std::string> cuda_devices() {
  std::vector<std::string> devices;
  if (!torch::cuda::is_available()) return devices;
  const int count = static_cast<int>(torch::cuda::device_count());
  for (int i = 0; i < count; ++i) {
    std::string line = "cuda:" + std::to_string(i);
#if VIT_WITH_CUDA_STATS
    cudaDeviceProp properties{};
    if (cudaGetDeviceProperties(&properties, i) == cudaSuccess) {
      std::ostringstream text;
      text << line << " " << properties.name << " (compute " << properties.major << "." << properties.minor << ", "
           << properties.totalGlobalMem / (1024 * 1024) << " MiB)";
      line = text.str();
    }
#endif
    devices.push_back(line);
  }
  return devices;
}

}  // namespace

SystemInfo describe_system() {
  SystemInfo info;
  std::string model = cpuinfo_value("model name");
  if (model.empty()) model = cpuinfo_value("Model name");  // some Arm kernels
  if (model.empty()) model = "unknown model";
  info.cpu = model + " (" + architecture() + ", " + std::to_string(std::thread::hardware_concurrency()) +
             " logical cores)";
  std::string flags = cpuinfo_value("flags");
  if (flags.empty()) flags = cpuinfo_value("Features");
  std::istringstream words(flags);
  for (std::string flag; words >> flag;) {
    if (kRelevantFlags.count(flag) > 0) info.cpu_flags.push_back(flag);
  }

  std::string available;
  for (const auto& kernels : available_row_kernels()) available += std::string(available.empty() ? "" : ", ") + kernels.isa;
  info.vit_kernels = std::string(row_kernels().isa) + " (this CPU and build: " + available + ")";
#if VIT_WITH_DNNL
  info.onednn = dnnl_version_text() + ", runs " + dnnl_cpu_isa();
#else
  info.onednn = "built without (int8 on vit's own kernels; no bf16)";
#endif
  info.libtorch = std::string(TORCH_VERSION) + ", its kernels " + aten_capability() + ", fast-path sgemm " +
                  sgemm_library();

  const std::string fp32 = PackedProducts::available()
                               ? "float32; inference products on oneDNN's packed brgemm kernels"
                               : std::string("float32; products through ") + sgemm_library() + "'s sgemm";
  info.precisions = {{"fp32", fp32},
                     {"int8", precision_kernel(Precision::int8)},
                     {"bf16", precision_kernel(Precision::bf16)},
                     {"fp16", precision_refusal(Precision::fp16, torch::kCPU)}};
  info.threads = at::get_num_threads();
  const std::string opencv = VIT_OPENCV_VERSION;
  info.opencv = VIT_WITH_OPENCV && !opencv.empty() ? opencv : "built without";
  info.cuda_devices = cuda_devices();
  for (const char* name : kSteering) {
    if (const char* value = std::getenv(name); value != nullptr) info.environment.emplace_back(name, value);
  }
  return info;
}

std::string to_text(const SystemInfo& info) {
  std::ostringstream out;
  auto line = [&](const std::string& name, const std::string& value) {
    out << name << std::string(name.size() < 13 ? 13 - name.size() : 1, ' ') << value << "\n";
  };
  line("cpu", info.cpu);
  std::string flags;
  for (const auto& flag : info.cpu_flags) flags += (flags.empty() ? "" : " ") + flag;
  line("instructions", flags.empty() ? "none of those vit looks for" : flags);
  line("vit kernels", info.vit_kernels);
  line("oneDNN", info.onednn);
  line("LibTorch", info.libtorch);
  line("threads", std::to_string(info.threads) + " (intra-op)");
  for (const auto& [name, how] : info.precisions) line("precision", name + ": " + how);
  line("OpenCV", info.opencv);
  if (info.cuda_devices.empty()) line("CUDA", "no devices");
  for (const auto& device : info.cuda_devices) line("CUDA", device);
  for (const auto& [name, value] : info.environment) line("environment", name + "=" + value);
  return out.str();
}

nlohmann::json to_json(const SystemInfo& info) {
  nlohmann::json precisions = nlohmann::json::object(), environment = nlohmann::json::object();
  for (const auto& [name, how] : info.precisions) precisions[name] = how;
  for (const auto& [name, value] : info.environment) environment[name] = value;
  return {{"cpu", info.cpu},           {"instructions", info.cpu_flags}, {"vit_kernels", info.vit_kernels},
          {"onednn", info.onednn},     {"libtorch", info.libtorch},      {"threads", info.threads},
          {"precisions", precisions},  {"opencv", info.opencv},          {"cuda_devices", info.cuda_devices},
          {"environment", environment}};
}

std::string cpu_paths_line() {
  std::string line = std::string("vit ") + row_kernels().isa;
#if VIT_WITH_DNNL
  line += std::string(", oneDNN ") + dnnl_cpu_isa();
#endif
  line += ", ATen " + aten_capability() + ", sgemm " + sgemm_library();
  line += "; int8: " + precision_kernel(Precision::int8);
  const auto bf16 = precision_refusal(Precision::bf16, torch::kCPU);
  line += std::string("; bf16: ") + (bf16.empty() ? precision_kernel(Precision::bf16) : "refused");
  return line;
}

}  // namespace vit
