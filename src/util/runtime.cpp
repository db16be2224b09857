// Process-wide runtime settings: libtorch thread pools, device selection by name, peak memory.
#include "util/runtime.h"

#include <dlfcn.h>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace vit {

void configure_allocator() {
#if defined(__GLIBC__)
  // glibc serves blocks above a moving threshold (128 KiB at first) with mmap and trims the heap top as soon as
  // 128 KiB lie free, so every training step faults in and zeroes the activation memory the previous step gave
  // back: 20-27% of a small model's step on the test machine. Blocks up to 32 MiB (the largest mmap threshold glibc
  // accepts) now stay in the heap and the heap is never trimmed, so one step's memory serves the next; the
  // process's footprint is its peak, as with PyTorch's own caching allocators.
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) mallopt(M_MMAP_THRESHOLD, 32 << 20);
  if (std::getenv("MALLOC_TRIM_THRESHOLD_") == nullptr) mallopt(M_TRIM_THRESHOLD, -1);
#endif
}

int configure_threads(int threads) {
  if (threads < 0) {
    throw std::invalid_argument("thread count must be >= 0 (0 = all cores), got " + std::to_string(threads));
  }
  int count = threads;
  if (count == 0) count = static_cast<int>(std::thread::hardware_concurrency());
  if (count <= 0) count = 1;  // hardware_concurrency() may report 0 when it cannot tell
  torch::set_num_threads(count);
  // libtorch allows the inter-op pool to be sized only once, and only before it has run any work; a second call
  // (tests, or a subcommand calling after main did) throws, and the first setting simply stays.
  static std::once_flag interop_once;
  std::call_once(interop_once, [count] {
    try {
      at::set_num_interop_threads(count);
    } catch (const c10::Error&) {
    }
  });
  return count;
}

void use_one_intra_op_thread() {
  at::get_num_threads();  // torch's lazy per-thread init, which would otherwise reset the count on first use
  // libtorch has already loaded libgomp; dlsym spares us linking it. Without OpenMP the symbol is absent.
  using SetNumThreads = void (*)(int);
  if (const auto set = reinterpret_cast<SetNumThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"))) set(1);
}

torch::Device resolve_device(const std::string& name) {
  const std::string allowed = "auto, cpu, cuda, cuda:N";
  if (name == "cpu") return torch::Device(torch::kCPU);
  if (name == "auto") return torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);

  int index = 0;
  if (name.rfind("cuda:", 0) == 0) {
    const std::string digits = name.substr(5);
    if (digits.empty() || digits.size() > 4 || digits.find_first_not_of("0123456789") != std::string::npos) {
      throw std::invalid_argument("unknown device '" + name + "': expected one of " + allowed);
    }
    index = std::stoi(digits);
  } else if (name != "cuda") {
    throw std::invalid_argument("unknown device '" + name + "': expected one of " + allowed);
  }
  if (!torch::cuda::is_available()) {
    throw std::runtime_error("device '" + name +
                             "' requested, but this libtorch has no CUDA support or no GPU is visible"
                             " (use --device cpu or auto)");
  }
  const int visible = static_cast<int>(torch::cuda::device_count());
  if (index >= visible) {
    throw std::runtime_error("device '" + name + "' requested, but only " + std::to_string(visible) +
                             " GPU(s) are visible (cuda:0..cuda:" + std::to_string(visible - 1) + ")");
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

double peak_rss_mb() {
  // /proc is Linux-only; elsewhere the figure is reported as 0 rather than failing a run over a statistic.
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) != 0) continue;
    std::istringstream fields(line.substr(6));
    double kib = 0.0;
    fields >> kib;
    return kib / 1024.0;
  }
  return 0.0;
}

}  // namespace vit
