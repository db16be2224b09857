// `vit bench`: throughput, step-time and latency percentiles, memory and achieved FLOP rate of a model on synthetic
// inputs of its own shape, with the machine's own matmul peak measured in the same run for comparison.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>
#include <torch/types.h>

#include "config/config.h"
#include "model/precision.h"
#include "model/vit.h"

namespace vit {

struct BenchOptions {
  std::string mode = "both";   // train | infer | both
  int64_t batch_size = 128;    // training batch, and the second inference batch (the first is always 1)
  int64_t steps = 20;          // timed iterations of each measurement
  int64_t warmup = 3;          // untimed iterations before each measurement
  std::string device = "auto"; // auto | cpu | cuda | cuda:N
  int threads = 0;             // intra-op threads (0 = all cores)
  AmpMode amp = AmpMode::off;  // CUDA autocast; on the CPU bf16 only (apply_amp, train/trainer.h), else float32
  Precision precision = Precision::fp32;  // inference only (model/precision.h); training stays float32 (or --amp)
  double peak_seconds = 0.5;   // time spent measuring the matmul peak (0 = skip it)
  uint64_t seed = 0;           // seeds the weights and the synthetic inputs
};

// Every rate is per second of wall time; "ms" figures are per call. Undefined measurements stay negative.
struct BenchResult {
  std::string device;        // e.g. "cpu", "cuda:0"
  AmpMode amp = AmpMode::off;  // the precision actually used
  Precision precision = Precision::fp32;  // inference's
  double weight_mb = -1.0;   // what inference's weights take (VisionTransformerImpl::weight_bytes), MiB
  int threads = 0;           // intra-op threads
  int64_t batch_size = 0;
  double gmacs = 0.0;        // forward multiply-accumulates per image (model/flops.h), in 1e9

  // training step: forward + label-smoothed loss + backward + clip + AdamW
  double train_img_per_s = -1.0;
  double step_ms_p50 = -1.0, step_ms_p95 = -1.0;
  double train_gflops = -1.0;  // 3 x forward FLOPs per image (forward + 2x backward) x img/s

  // inference (InferenceMode, eval): batch 1 and batch `batch_size`
  double latency_ms_p50 = -1.0, latency_ms_p95 = -1.0;              // batch 1
  double batch_latency_ms_p50 = -1.0, batch_latency_ms_p95 = -1.0;  // batch `batch_size`
  double infer_img_per_s = -1.0;                                    // at batch `batch_size`
  double infer_gflops = -1.0;

  double peak_gflops = -1.0;     // best torch::mm rate measured in this run (sgemm on CPU; the AMP dtype on CUDA)
  std::string peak_dtype;        // dtype of that matmul
  std::string torch_blas;        // CPU: the BLAS behind torch::mm, "MKL" or "OpenBLAS <its kernels>", else ""
  double kernel_peak_gflops = -1.0;  // CPU: best rate of the same product through the model's own linear layer
                                     // (oneDNN sgemm, model/cpu_kernels.h), when that differs from torch::mm
  double peak_rss_mb = 0.0;      // peak resident memory of the process
  double peak_cuda_mb = -1.0;    // peak CUDA memory allocated by tensors (CUDA builds only)

  // The headline figures: training when it ran, else inference at `batch_size`.
  double img_per_s() const { return train_img_per_s >= 0 ? train_img_per_s : infer_img_per_s; }
  double gflops() const { return train_gflops >= 0 ? train_gflops : infer_gflops; }
  // The machine's peak is the faster of the two products measured: Debian's LibTorch runs torch::mm through OpenBLAS,
  // which on a CPU newer than its release picks generic SSE3 kernels ("Prescott") at a fraction of oneDNN's rate.
  double best_peak_gflops() const { return std::max(peak_gflops, kernel_peak_gflops); }
  double peak_fraction() const { return best_peak_gflops() > 0 ? gflops() / best_peak_gflops() : -1.0; }
  double kernel_peak_fraction() const { return kernel_peak_gflops > 0 ? gflops() / kernel_peak_gflops : -1.0; }
};

// Builds the model from `model` (fresh weights), benches what options.mode asks for and reports it.
// Throws std::invalid_argument for bad options (unknown mode, training a model without a head, ...).
BenchResult run_bench(const ModelConfig& model, const BenchOptions& options);
// The same for a model as loaded (vit bench --checkpoint): its own weights, at the size it runs at.
BenchResult run_bench(VisionTransformer& net, const BenchOptions& options);

// Best rate of one n x n by n x n matmul on `device` in `dtype` over about `seconds` of repeats, in GFLOP/s:
// torch::mm, or (through_model_linear) the model's own linear layer, which may use another GEMM on CPU.
double measure_matmul_peak(torch::Device device, torch::ScalarType dtype, double seconds, int64_t n = 1024,
                           bool through_model_linear = false);

// Nearest-rank percentile (q in [0, 100]) of unsorted samples; NaN when empty.
double percentile(std::vector<double> samples, double q);

// One JSON object: img_per_s, step_ms_p50/p95, latency_ms_p50/p95, peak_rss_mb, gflops, peak_fraction, and the
// detail fields; measurements that did not run are null.
nlohmann::json to_json(const BenchResult& result);

}  // namespace vit
