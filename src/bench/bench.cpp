// `vit bench`: times the real training step (FlatAdamW, classification_loss) and InferenceMode forwards on random
// inputs, and the machine's matmul peak in the same process, so the achieved fraction compares like with like.
#include "bench/bench.h"
#include "model/autocast.h"

#include <c10/core/InferenceMode.h>
#include <dlfcn.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "model/cpu_kernels.h"
#include "model/flops.h"
#include "model/vit.h"
#include "train/optimizer.h"
#include "train/trainer.h"
#include "util/log.h"
#include "util/runtime.h"
#include "vit/build_config.h"

#if VIT_WITH_CUDA_STATS
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace vit {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// Runs `fn` `warmup` times untimed, then `steps` times, each timed to completion on the device; seconds per call.
std::vector<double> time_calls(const std::function<void()>& fn, int64_t warmup, int64_t steps,
                               const torch::Device& device) {
  for (int64_t i = 0; i < warmup; ++i) fn();
  synchronize(device);
  std::vector<double> seconds;
  seconds.reserve(static_cast<size_t>(steps));
  for (int64_t i = 0; i < steps; ++i) {
    const auto start = Clock::now();
    fn();
    synchronize(device);
    seconds.push_back(seconds_since(start));
  }
  return seconds;
}

double sum(const std::vector<double>& values) {
  double total = 0.0;
  for (double v : values) total += v;
  return total;
}

void reset_cuda_peak(const torch::Device& device) {
#if VIT_WITH_CUDA_STATS
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
}

double cuda_peak_mb(const torch::Device& device) {
#if VIT_WITH_CUDA_STATS
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return static_cast<double>(stats.allocated_bytes[0].peak) / (1024.0 * 1024.0);  // [0] = all pools
  }
#endif
  return -1.0;
}

void check_options(const ModelConfig& model, const BenchOptions& options) {
  if (options.mode != "train" && options.mode != "infer" && options.mode != "both") {
    throw std::invalid_argument("bench mode \"" + options.mode + "\" is not one of: train, infer, both");
  }
  if (options.batch_size < 1) {
    throw std::invalid_argument("bench batch size must be at least 1, got " + std::to_string(options.batch_size));
  }
  if (options.steps < 1) throw std::invalid_argument("bench steps must be at least 1, got " + std::to_string(options.steps));
  if (options.warmup < 0) throw std::invalid_argument("bench warmup must be >= 0, got " + std::to_string(options.warmup));
  if (options.mode != "infer" && model.num_classes < 1) {
    throw std::invalid_argument("cannot bench training of a model without a head (model.num_classes 0); "
                                "use --mode infer or set model.num_classes");
  }
}

// The BLAS behind torch::mm: "MKL" (PyTorch's wheels link it in), else "OpenBLAS <kernels>" (Debian's LibTorch;
// "Prescott" where OpenBLAS does not know the CPU), else "". OpenBLAS may be loaded beside MKL (Debian's libdnnl and
// OpenCV pull it in), so MKL is asked first (mkl_blas_loaded).
std::string torch_blas() {
  if (mkl_blas_loaded()) return "MKL";
  using CoreName = char* (*)();
  const auto core_name = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  const char* name = core_name != nullptr ? core_name() : nullptr;
  return name != nullptr ? std::string("OpenBLAS ") + name : "";
}

}  // namespace

double percentile(std::vector<double> samples, double q) {
  if (samples.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(samples.begin(), samples.end());
  const auto rank = static_cast<int64_t>(std::ceil(q / 100.0 * static_cast<double>(samples.size())));
  const auto index = std::clamp<int64_t>(rank - 1, 0, static_cast<int64_t>(samples.size()) - 1);
  return samples[static_cast<size_t>(index)];
}

double measure_matmul_peak(torch::Device device, torch::ScalarType dtype, double seconds, int64_t n,
                           bool through_model_linear) {
  c10::InferenceMode inference;
  const auto options = torch::TensorOptions().device(device).dtype(dtype);
  auto a = torch::randn({n, n}, options), b = torch::randn({n, n}, options), out = torch::empty({n, n}, options);
  auto product = [&] {
    if (through_model_linear) {
      out = linear(a, b, /*bias=*/torch::Tensor());  // a b^T: the same FLOPs
    } else {
      torch::mm_out(out, a, b);
    }
  };
  product();  // first call: thread pools, BLAS buffers, CUDA handles
  synchronize(device);
  double best = std::numeric_limits<double>::infinity();
  const auto begin = Clock::now();
  do {
    const auto start = Clock::now();
    product();
    synchronize(device);
    best = std::min(best, seconds_since(start));
  } while (seconds_since(begin) < seconds);
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / best / 1e9;
}

BenchResult run_bench(const ModelConfig& model_config, const BenchOptions& options) {
  validate(model_config, "model");
  check_options(model_config, options);
  torch::manual_seed(options.seed);
  VisionTransformer net(model_config);
  return run_bench(net, options);
}

BenchResult run_bench(VisionTransformer& net, const BenchOptions& options) {
  const ModelConfig& model_config = net->config();
  check_options(model_config, options);
  BenchResult result;
  result.threads = configure_threads(options.threads);
  const torch::Device device = resolve_device(options.device);
  result.device = device.str();
  if (options.mode != "train") {
    const auto refusal = precision_refusal(options.precision, device.type());
    if (!refusal.empty()) throw std::invalid_argument(refusal);
  }
  net->to(device);
  result.amp = apply_amp(net, options.amp, device, "--amp");        // on the CPU: the fused blocks' bf16 products
  const bool amp = result.amp != AmpMode::off && device.is_cuda();  // CUDA autocast
  const bool fp16 = amp && result.amp == AmpMode::fp16;
  const auto amp_dtype = fp16 ? torch::kHalf : torch::kBFloat16;
  result.batch_size = options.batch_size;
  const auto macs = static_cast<double>(forward_macs(model_config));
  result.gmacs = macs / 1e9;

  if (options.peak_seconds > 0) {
    // On CUDA the peak is taken in the dtype the tensor cores see under autocast, at a size that fills the GPU.
    const auto peak_dtype = amp ? amp_dtype : torch::kFloat32;
    result.peak_dtype = c10::toString(peak_dtype);
    result.peak_gflops = measure_matmul_peak(device, peak_dtype, options.peak_seconds, device.is_cuda() ? 4096 : 1024);
    if (device.is_cpu()) result.torch_blas = torch_blas();
    if (device.is_cpu() && cpu_kernels_available()) {
      result.kernel_peak_gflops = measure_matmul_peak(device, peak_dtype, options.peak_seconds, 1024,
                                                      /*through_model_linear=*/true);
    }
  }

  torch::manual_seed(options.seed);
  if (device.is_cuda()) torch::cuda::manual_seed_all(options.seed);
  const int64_t B = options.batch_size;
  const auto input_options = torch::TensorOptions().device(device);
  const std::vector<int64_t> image_shape{model_config.in_chans, model_config.img_h, model_config.img_w};
  auto images_of = [&](int64_t batch) {
    std::vector<int64_t> shape{batch};
    shape.insert(shape.end(), image_shape.begin(), image_shape.end());
    return torch::randn(shape, input_options);
  };
  reset_cuda_peak(device);

  if (options.mode != "infer") {
    TrainConfig train;  // the optimiser's defaults: AdamW betas/eps/decay, clip 1.0, label smoothing 0.1
    std::vector<std::pair<std::string, torch::Tensor>> named_parameters;
    for (const auto& item : net->named_parameters()) named_parameters.emplace_back(item.key(), item.value());
    FlatAdamW optimizer(named_parameters, train);
    auto images = images_of(B);
    auto labels = torch::randint(0, model_config.num_classes, {B}, input_options.dtype(torch::kInt64));
    const double loss_scale = fp16 ? 1024.0 : 1.0;  // fixed: a few steps cannot overflow-and-recover meaningfully
    net->train();
    auto step = [&] {
      optimizer.zero_grad();
      torch::Tensor loss;
      {
        AutocastScope autocast(amp, amp_dtype);
        loss = classification_loss(net->forward(images), labels, /*soft_targets=*/{}, train.label_smoothing);
      }
      (loss * loss_scale).backward();
      if (fp16) optimizer.grads().div_(loss_scale);
      optimizer.clip_grad_norm(train.clip_grad);
      optimizer.step(/*lr=*/1e-4);
      const double value = loss.item<double>();  // the trainer reads the loss every step too
      if (!std::isfinite(value)) throw std::runtime_error("bench: training loss is " + std::to_string(value));
    };
    const auto seconds = time_calls(step, options.warmup, options.steps, device);
    result.train_img_per_s = static_cast<double>(B * options.steps) / sum(seconds);
    result.step_ms_p50 = percentile(seconds, 50) * 1e3;
    result.step_ms_p95 = percentile(seconds, 95) * 1e3;
    // Forward + 2x backward, 2 FLOPs per MAC, on the tokens training keeps (model.patch_drop_rate).
    const auto train_macs = static_cast<double>(forward_macs(model_config, 0, 0, /*training=*/true));
    result.train_gflops = 6.0 * train_macs * result.train_img_per_s / 1e9;
  }

  if (options.mode != "train") {
    net->eval();
    net->set_precision(options.precision);
    result.precision = options.precision;
    result.weight_mb = static_cast<double>(net->weight_bytes()) / (1024.0 * 1024.0);
    c10::InferenceMode inference;
    AutocastScope autocast(amp, amp_dtype);
    auto one = images_of(1);
    auto batch = images_of(B);
    auto latency = time_calls([&] { net->forward(one); }, options.warmup, options.steps, device);
    result.latency_ms_p50 = percentile(latency, 50) * 1e3;
    result.latency_ms_p95 = percentile(latency, 95) * 1e3;
    auto batched = time_calls([&] { net->forward(batch); }, options.warmup, options.steps, device);
    result.batch_latency_ms_p50 = percentile(batched, 50) * 1e3;
    result.batch_latency_ms_p95 = percentile(batched, 95) * 1e3;
    result.infer_img_per_s = static_cast<double>(B * options.steps) / sum(batched);
    result.infer_gflops = 2.0 * macs * result.infer_img_per_s / 1e9;
  }

  result.peak_rss_mb = peak_rss_mb();
  result.peak_cuda_mb = cuda_peak_mb(device);
  net->set_precision(Precision::fp32);
  return result;
}

nlohmann::json to_json(const BenchResult& r) {
  auto value = [](double v) { return v >= 0 && std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  return {
      {"img_per_s", value(r.img_per_s())},
      {"step_ms_p50", value(r.step_ms_p50)},
      {"step_ms_p95", value(r.step_ms_p95)},
      {"latency_ms_p50", value(r.latency_ms_p50)},
      {"latency_ms_p95", value(r.latency_ms_p95)},
      {"peak_rss_mb", value(r.peak_rss_mb)},
      {"gflops", value(r.gflops())},
      {"peak_fraction", value(r.peak_fraction())},
      {"device", r.device},
      {"amp", name_of(r.amp)},
      {"precision", name_of(r.precision)},
      {"weight_mb", value(r.weight_mb)},
      {"threads", r.threads},
      {"batch_size", r.batch_size},
      {"gmacs", r.gmacs},
      {"train_img_per_s", value(r.train_img_per_s)},
      {"train_gflops", value(r.train_gflops)},
      {"batch_latency_ms_p50", value(r.batch_latency_ms_p50)},
      {"batch_latency_ms_p95", value(r.batch_latency_ms_p95)},
      {"infer_img_per_s", value(r.infer_img_per_s)},
      {"infer_gflops", value(r.infer_gflops)},
      {"peak_gflops", value(r.peak_gflops)},
      {"peak_dtype", r.peak_dtype},
      {"best_peak_gflops", value(r.best_peak_gflops())},
      {"torch_blas", r.torch_blas.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.torch_blas)},
      {"kernel_peak_gflops", value(r.kernel_peak_gflops)},
      {"kernel_peak_fraction", value(r.kernel_peak_fraction())},
      {"peak_cuda_mb", value(r.peak_cuda_mb)},
  };
}

}  // namespace vit
