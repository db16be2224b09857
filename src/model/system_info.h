// What `vit info --system` reports, and what a bug report needs: the CPU and its instruction sets, the ones vit's
// kernels and oneDNN run on it (with any cap the environment sets), how each precision runs or why it cannot, the
// threads, the libraries' versions and the CUDA devices.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace vit {

struct SystemInfo {
  std::string cpu;                     // model name, architecture, logical cores
  std::vector<std::string> cpu_flags;  // the instruction sets vit's paths depend on that this CPU has
  std::string vit_kernels;             // the row kernels' instruction set (row_kernels()) and those available
  std::string onednn;                  // version and the instruction set it runs, or why absent
  std::string libtorch;                // version, its own kernels' CPU capability, the sgemm the fast path runs
  std::vector<std::pair<std::string, std::string>> precisions;  // CPU inference: fp32, int8, bf16, fp16
  int threads = 0;                                              // intra-op threads now
  std::string opencv;                                           // version, or "built without"
  std::vector<std::string> cuda_devices;                        // name, compute capability, memory
  std::vector<std::pair<std::string, std::string>> environment;  // the set variables that steer these paths
};

SystemInfo describe_system();
// The report as `vit info --system` prints it, one "name  value" line each.
std::string to_text(const SystemInfo& info);
nlohmann::json to_json(const SystemInfo& info);
// One line of the paths this process takes ("vit avx2, oneDNN avx2, ATen AVX2, int8: vit avx2 kernel, 7-bit
// weights, bf16: refused"), for test logs and benchmark results.
std::string cpu_paths_line();

}  // namespace vit
