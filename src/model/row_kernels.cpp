// The row kernels at the x86-64 baseline (or whatever the target's default is), and the choice among the compiled
// instruction sets by what this CPU has (model/row_kernels.h).
#define VIT_ROW_KERNELS_ISA baseline
#define VIT_VECTOR_FLOATS 4
#include <cstdlib>
#include <cstring>
#include <string>

#include "model/row_kernels_impl.h"

namespace vit {
#if VIT_ROW_KERNELS_X86
namespace avx2 {
RowKernels table(const char* isa);
}
namespace avx512 {
RowKernels table(const char* isa);
}
#endif

namespace {

RowKernels choose_row_kernels() {
  const auto available = available_row_kernels();
  const char* forced = std::getenv("VIT_CPU_ISA");
  if (forced == nullptr || *forced == '\0') return available.front();
  std::string names;
  for (const auto& kernels : available) {
    if (kernels.isa == std::string(forced)) return kernels;
    names += std::string(names.empty() ? "" : ", ") + kernels.isa;
  }
  throw std::invalid_argument(std::string("VIT_CPU_ISA=") + forced + ": this build and CPU run " + names);
}

}  // namespace

std::vector<RowKernels> available_row_kernels() {
  std::vector<RowKernels> available;
#if VIT_ROW_KERNELS_X86
  __builtin_cpu_init();
  const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2_fma && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq")) {
    available.push_back(avx512::table("avx512"));
  }
  if (avx2_fma) available.push_back(avx2::table("avx2"));
#endif
  available.push_back(baseline::table("baseline"));
  return available;
}

void pack_int8_weight(const int8_t* q, int64_t N, int64_t K, int8_t* panels, int32_t* colsum) {
  const int64_t K4 = int8_k4(K), width = kInt8PanelWidth;
  std::memset(panels, 0, static_cast<size_t>(int8_panels(N) * K4 * width));
  for (int64_t n = 0; n < N; ++n) {
    int8_t* panel = panels + (n / width) * K4 * width;
    int32_t sum = 0;
    for (int64_t k = 0; k < K; ++k) {
      panel[(k / 4) * width * 4 + (n % width) * 4 + k % 4] = q[n * K + k];  // (K4 / 4, 16, 4)
      sum += q[n * K + k];
    }
    colsum[n] = sum;
  }
}

const RowKernels& row_kernels() {
  static const RowKernels kernels = choose_row_kernels();
  return kernels;
}

}  // namespace vit
