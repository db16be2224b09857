// Process-wide runtime settings: thread counts and device selection.
#pragma once

#include <string>

#include <torch/types.h>

namespace vit {

// Keeps freed memory in the process instead of handing it back to the kernel after every step (glibc malloc;
// nothing elsewhere). Call once at start-up, before threads allocate; MALLOC_*_ environment variables still win.
void configure_allocator();
// Sets libtorch's intra-op threads (0 = all cores); Debian's libtorch otherwise starts with one thread.
int configure_threads(int threads);
// Keeps this thread's own torch calls (a decode worker's resize) from starting a whole OpenMP team beside the model's
// threads: at::set_num_threads would change the process-wide count, but OpenMP's count belongs to the calling thread.
// Without OpenMP it does nothing.
void use_one_intra_op_thread();
// "auto" picks CUDA when this libtorch has it and a GPU is visible; "cuda" without one throws.
torch::Device resolve_device(const std::string& name);
// Peak resident set size of this process in MiB (from /proc/self/status VmHWM).
double peak_rss_mb();

}  // namespace vit
